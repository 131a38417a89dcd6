"""Large problems: 64-bit index arithmetic, and a clear error where BLAS's 32-bit ints end.

* The BLAS behind ``scipy.linalg.cython_blas`` takes 32-bit ``int`` sizes. Problems with a
  matrix dimension above 2**31 - 1 (rows T*B, input width, 4*H) are refused by the
  validation with a ValueError, before anything is allocated, instead of wrapping
  around. These tests use zero-stride views (``np.broadcast_to``), so they need no memory
  and always run.
* ``@pytest.mark.large`` (opt-in: ``--runlarge`` or ``LSTMCY_TEST_LARGE=1``; about 9 GB
  of RAM and a minute): a forward and backward whose gate-gradient buffer, gate buffer
  and saved activations are each larger than 2**31 bytes, checked against the numpy
  reference on sequences sampled across the whole batch (including the last ones, at
  byte offsets beyond 2**31).
"""
import resource

import numpy as np
import pytest

import lstmcy
from lstmcy import reference
from lstmcy._engine.validation import BLAS_INT_MAX, check_blas_limits

BIG = 2 ** 31  # one more than the largest BLAS int


def zeros_view(shape, dtype=np.float32):
    """A read-only all-zero array of ``shape`` that occupies no memory."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def params_for(I, H, dtype=np.float32):
    return [zeros_view((4 * H, I), dtype), zeros_view((4 * H, H), dtype),
            zeros_view((4 * H,), dtype), zeros_view((4 * H,), dtype)]


CASES = {
    # name: (input shape, I, H, kwargs, message pattern)
    "rows-B": ((1, BIG, 1), 1, 1, {}, r"batch size B = 2147483648"),
    "rows-T": ((BIG, 1, 1), 1, 1, {}, r"T\*B = 2147483648\*1"),
    "rows-T*B": ((2 ** 16, 2 ** 15 + 1, 1), 1, 1, {}, r"T\*B = 65536\*32769"),
    "batch-without-steps": ((0, BIG, 1), 1, 1, {}, r"batch size B = 2147483648"),
    "input-width": ((1, 1, BIG), BIG, 1, {}, r"input size \+ num_directions\*H"),
    "hidden-4H": ((1, 1, 1), 1, 2 ** 29, {}, r"4\*num_directions\*H = 2147483648"),
    "hidden-bidirectional": ((1, 1, 1), 1, 2 ** 28, {"bidirectional": True},
                             r"4\*num_directions\*H = 2147483648"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sizes_beyond_32_bit_blas_are_refused(name):
    shape, I, H, kwargs, pattern = CASES[name]
    D = 2 if kwargs.get("bidirectional") else 1
    x = zeros_view(shape)
    params = params_for(I, H) * D
    before = peak_rss_mb()
    with pytest.raises(ValueError, match=pattern) as info:
        lstmcy.lstm_forward(x, None, params, **kwargs)
    assert "2147483647" in str(info.value) and "32-bit" in str(info.value)
    # Refused before allocating anything proportional to the sizes.
    assert peak_rss_mb() - before < 100


def test_backward_refuses_sizes_beyond_32_bit_blas():
    x = zeros_view((1, BIG, 1))
    saved = [[zeros_view((1, BIG, 1))] for _ in range(7)]
    dy = zeros_view((1, BIG, 1))
    before = peak_rss_mb()
    with pytest.raises(ValueError, match=r"input is too large: the batch size B = 2147483648"):
        lstmcy.lstm_backward(x, None, params_for(1, 1), dy, None, None, *saved)
    assert peak_rss_mb() - before < 100


def test_packed_batch_sizes_beyond_32_bit_blas_are_refused():
    x = zeros_view((3 * 2 ** 30, 1))
    with pytest.raises(ValueError, match=r"T\*B = 3\*1073741824"):
        lstmcy.lstm_forward(x, None, params_for(1, 1), batch_sizes=np.full(3, 2 ** 30))
    with pytest.raises(ValueError, match=r"batch_sizes must be at most 2147483647"):
        lstmcy.lstm_forward(zeros_view((BIG, 1)), None, params_for(1, 1),
                            batch_sizes=np.array([BIG]))


@pytest.mark.parametrize("T, B, I, H, L, D", [
    (1, BLAS_INT_MAX, 1, 1, 1, 1),
    (0, BLAS_INT_MAX, 1, 1, 1, 1),
    (BLAS_INT_MAX, 1, 1, 1, 1, 1),
    (1, 1, BLAS_INT_MAX - 1, 1, 1, 1),
    (1, 1, 1, (BLAS_INT_MAX - 3) // 4, 1, 1),
    (1, 1, 1, (BLAS_INT_MAX - 7) // 8, 3, 2),
])
def test_limits_are_exact(T, B, I, H, L, D):
    """The largest sizes are accepted, one more is refused."""
    check_blas_limits(T, B, I, H, L, D)
    for bigger in ((T + 1, B, I, H), (T, B + 1, I, H), (T, B, I + 1, H), (T, B, I, H + 1)):
        Tb, Bb, Ib, Hb = bigger
        width = (max(Ib, D * Hb) if L > 1 else Ib) + D * Hb
        over = Bb > BLAS_INT_MAX or Tb * Bb > BLAS_INT_MAX or width > BLAS_INT_MAX or 4 * D * Hb > BLAS_INT_MAX
        if over:
            with pytest.raises(ValueError, match="2147483647"):
                check_blas_limits(*bigger, L, D)
        else:
            check_blas_limits(*bigger, L, D)


# ---------------------------------------------------------------------------
# Opt-in: real buffers larger than 2**31 bytes
# ---------------------------------------------------------------------------

@pytest.mark.large
def test_buffers_larger_than_2gib():
    """T=4, B=2**22+2**18, H=8, I=4, float32: the gate buffers [T*B, 4H] hold
    2.2e9 bytes each, every saved activation 0.56e9, dy/y 0.56e9.

    The batch consists of K distinct sequences repeated; sequences are independent, so
    the reference on those K sequences gives every per-sequence output exactly, and the
    weight gradients are (B/K) times the reference's (up to float32 summation error).
    """
    T, I, H, K = 4, 4, 8, 64
    B = 2 ** 22 + 2 ** 18  # T*B*4H*4 bytes = 2.28e9 > 2**31
    assert T * B * 4 * H * 4 > 2 ** 31
    rng = np.random.default_rng(0)
    pattern = rng.standard_normal((T, K, I)).astype(np.float32)
    params = [rng.uniform(-0.5, 0.5, s).astype(np.float32)
              for s in ((4 * H, I), (4 * H, H), (4 * H,), (4 * H,))]
    x = np.tile(pattern, (1, B // K, 1))
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, None, params)
    dy_pattern = rng.standard_normal((T, K, H)).astype(np.float32)
    dy = np.tile(dy_pattern, (1, B // K, 1))
    dx, dh, dc, dparams = lstmcy.lstm_backward(x, None, params, dy, None, None, *cache.saved())
    del cache

    y_r, h_r, c_r, cache_r = reference.lstm_forward(pattern, None, params)
    dx_r, dh_r, dc_r, dp_r = reference.lstm_backward(pattern, None, params, dy_pattern, None,
                                                     None, *cache_r.saved())
    # Sequences sampled across the batch, including the very last ones.
    picks = np.unique(np.concatenate([np.arange(K), np.arange(B - K, B),
                                      rng.integers(0, B, 4096)]))
    for name, ours, ref, axis in (("y", y, y_r, 1), ("dx", dx, dx_r, 1),
                                  ("h_n", h_n, h_r, 1), ("c_n", c_n, c_r, 1),
                                  ("dh_prev", dh, dh_r, 1), ("dc_prev", dc, dc_r, 1)):
        got = np.take(ours, picks, axis=axis)
        want = np.take(ref, picks % K, axis=axis)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=name)
    repeats = B // K
    for k, (ours, ref) in enumerate(zip(dparams, dp_r)):
        scale = np.abs(ref).max() * repeats
        err = np.abs(ours.astype(np.float64) - repeats * ref.astype(np.float64)).max()
        assert err <= 1e-3 * scale, f"dparams[{k}]: error {err:.3g} for scale {scale:.3g}"
