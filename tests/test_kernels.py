"""The kernels' own pieces: the vectorised exp/sigmoid/tanh, the instruction-set builds and
the thread layouts (one direction split per step, two directions side by side, the
recurrence overlapped with the weight GEMMs)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import lstmcy
from lstmcy import reference
from lstmcy._engine import dispatch as _dispatch
from lstmcy._engine.saturation import CORRECTLY_ROUNDED_TANH_ONE_FROM


def _special_and_sweep(dtype):
    sweep = np.concatenate([np.linspace(-120, 120, 200001), np.geomspace(1e-30, 60, 20001),
                            -np.geomspace(1e-30, 60, 20001)])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 800.0, -800.0,
                        88.7, -103.9, 710.0, -745.0])
    return np.concatenate([sweep, special]).astype(dtype)


@pytest.mark.parametrize("build", _dispatch.available_builds())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_and_tanh_are_accurate_to_two_ulp(dtype, build):
    """Error relative to the true value, in units of eps (the largest, ~1.8, is sigmoid's
    for negative x: e / (1 + e) keeps the error of e = exp(x))."""
    kernels = _dispatch.load(build)
    x = _special_and_sweep(dtype)
    sig, tanh = np.empty_like(x), np.empty_like(x)
    kernels._vector_sigmoid(x, sig)
    kernels._vector_tanh(x, tanh)
    exact = x.astype(np.longdouble)
    with np.errstate(over="ignore"):
        sig_ref = (1 / (1 + np.exp(-exact))).astype(dtype)
    tanh_ref = np.tanh(exact).astype(dtype)
    eps, tiny = np.finfo(dtype).eps, np.finfo(dtype).tiny
    for got, ref, name in ((sig, sig_ref, "sigmoid"), (tanh, tanh_ref, "tanh")):
        normal = np.isfinite(ref) & (np.abs(ref) >= tiny)
        ulp = np.abs(got[normal].astype(np.longdouble) - ref[normal]) / np.abs(ref[normal]) / eps
        assert ulp.max() <= 2, f"{name}: {float(ulp.max()):.2f} ulp"
        np.testing.assert_array_equal(np.isnan(got), np.isnan(x), err_msg=name)
        # Results below the normal range (sigmoid of large negative x) are 0 or close to
        # the true value: never more than the smallest normal number off.
        tiny_ref = np.isfinite(ref) & (np.abs(ref) < tiny)
        assert np.all(np.abs(got[tiny_ref].astype(np.longdouble) - ref[tiny_ref]) <= tiny), name
    # Saturation is exact, as in PyTorch: sigmoid(+-inf) = 1 / 0, tanh(+-inf) = +-1.
    np.testing.assert_array_equal(sig[np.isinf(x)], (x[np.isinf(x)] > 0).astype(dtype))
    np.testing.assert_array_equal(tanh[np.isinf(x)], np.sign(x[np.isinf(x)]))
    assert np.all((sig[np.isfinite(x)] >= 0) & (sig[np.isfinite(x)] <= 1))
    assert np.all(np.abs(tanh[np.isfinite(x)]) <= 1)


def _true_sigmoid(x):
    """sigmoid in long double, as 1 - e/(1 + e) for x >= 0 (1 + e would round)."""
    x = x.astype(np.longdouble)
    s = np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x)))
    return np.where(x >= 0, 1 - s, s)


def _every_float32(lo, hi):
    """Every float32 in [lo, hi) (0 < lo < hi)."""
    bits = np.array([lo, hi], dtype=np.float32).view(np.int32)
    return np.arange(bits[0], bits[1], dtype=np.int32).view(np.float32)


PYTORCH_SIGMOID_ONE_FROM = 36.73680056967711  # 1 + exp(-x) rounds to 1 from here on

_SATURATED = {  # name: (test hook, true function, start of the saturated end)
    "sigmoid": ("_vector_sigmoid", _true_sigmoid, 0.0),
    "tanh": ("_vector_tanh", lambda x: np.tanh(x.astype(np.longdouble)), 0.625),
}


@pytest.mark.parametrize("build", _dispatch.available_builds())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", _SATURATED)
def test_saturated_ends_are_correctly_rounded(name, dtype, build):
    """Towards +-1 the only error beyond correct rounding is that of the small remainder
    1 - |r| (at most 2 eps relative): |error| <= ulp/2 + 2 eps (1 - |r|). Deep in the end
    (1 - |r| < 2**-19, float32: every float there) the results equal the correctly rounded
    values, up to and including the exact 1 where that is the correctly rounded value
    (checked here on every fifth float; all of them pass)."""
    hook, true, start = _SATURATED[name]
    kernels = _dispatch.load(build)
    eps = np.finfo(dtype).eps
    if dtype == np.float32:
        x = _every_float32(max(start, 2.0 ** -20), 18.0)
        x = np.ascontiguousarray(x[::x.size // 300_000])
        slack = 0.0
    else:
        x = np.linspace(start, 38.0, 300_001)
        slack = 2.0 ** -9 * eps  # long double resolves a double's ulp to ~2**-11
    x = np.concatenate([x, -x]) if name == "tanh" else x
    got = np.empty_like(x)
    getattr(kernels, hook)(x, got)
    if dtype == np.float64:
        # In float64 the ends follow PyTorch's (src/lstmcy/_fastmath.pxd): sigmoid is
        # exactly 1 from 53 ln2 on, tanh is 1 - 2**-53 in a window from the correctly
        # rounded point to PyTorch's on this CPU (kernels.get_tanh_one_from()); there they
        # are one ulp from correctly rounded, by design.
        if name == "tanh":  # and the window itself, densely
            window = np.linspace(CORRECTLY_ROUNDED_TANH_ONE_FROM, kernels.get_tanh_one_from(),
                                 1001)
            inside = np.empty_like(window)
            kernels._vector_tanh(window, inside)
            np.testing.assert_array_equal(inside[:-1], 1 - 2.0 ** -53)
            assert inside[-1] == 1.0
        pytorch_end = (x >= PYTORCH_SIGMOID_ONE_FROM if name == "sigmoid"
                       else (np.abs(x) >= CORRECTLY_ROUNDED_TANH_ONE_FROM)
                       & (np.abs(x) < kernels.get_tanh_one_from()))
        if name == "sigmoid":
            np.testing.assert_array_equal(got[pytorch_end], 1.0)
        x, got = x[~pytorch_end], got[~pytorch_end]
    exact = true(x)
    remainder = 1 - np.abs(exact)
    error = np.abs(got.astype(np.longdouble) - exact)
    # ulp of results in [1/2, 1) is eps/2; an exact 1 is within half of it of r.
    bound = eps / 4 + 2 * eps * remainder + slack
    worst = np.argmax(error - bound)
    assert error[worst] <= bound[worst], (
        f"{name}({x[worst]!r}) = {got[worst]!r}: error {float(error[worst] / eps * 2):.4f} ulp")
    if dtype == np.float32:
        deep = _every_float32(*((13.9, 17.4) if name == "sigmoid" else (7.0, 9.1)))
        deep = np.ascontiguousarray(deep[::5])
        got = np.empty_like(deep)
        getattr(kernels, hook)(deep, got)
        exact = true(deep)
        # From 1 - r < 2**-19 to beyond 1 - r < 2**-25, where r rounds to 1.
        assert float(1 - exact.min()) < 2.0 ** -19 and float(1 - exact.max()) < 2.0 ** -25
        wrong = np.flatnonzero(got != exact.astype(np.float32))
        assert wrong.size == 0, f"{name}: {wrong.size} results not correctly rounded, e.g. at {deep[wrong[:3]]}"


@pytest.mark.parametrize("build", _dispatch.available_builds())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activation_special_values_are_exact(dtype, build):
    kernels = _dispatch.load(build)
    info = np.finfo(dtype)
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, info.max, -info.max,
                  info.tiny, -info.tiny], dtype=dtype)
    sig, tanh = np.empty_like(x), np.empty_like(x)
    kernels._vector_sigmoid(x, sig)
    kernels._vector_tanh(x, tanh)
    want_sig = np.array([0.5, 0.5, 1, 0, np.nan, 1, 0, 1, 0, 0.5, 0.5], dtype=dtype)
    want_tanh = np.array([0.0, -0.0, 1, -1, np.nan, 1, -1, 1, -1, info.tiny, -info.tiny], dtype=dtype)
    np.testing.assert_array_equal(sig, want_sig)
    np.testing.assert_array_equal(tanh, want_tanh)
    np.testing.assert_array_equal(np.signbit(tanh), np.signbit(want_tanh))  # tanh(-0) = -0


def test_activation_builds_are_bitwise_identical():
    """The FMA builds (AVX2, AVX-512) compute the activations with the same IEEE
    operations, so they agree to the bit over the whole range, special values included."""
    builds = [b for b in _dispatch.available_builds() if b != "baseline"]
    if len(builds) < 2:
        pytest.skip(f"only {builds or 'no'} FMA build runs on this CPU")
    for dtype in (np.float32, np.float64):
        x = _special_and_sweep(dtype)
        outputs = []
        for build in builds:
            kernels = _dispatch.load(build)
            sig, tanh = np.empty_like(x), np.empty_like(x)
            kernels._vector_sigmoid(x, sig)
            kernels._vector_tanh(x, tanh)
            outputs.append(np.concatenate([sig, tanh]).view(f"u{x.itemsize}"))
        for build, out in zip(builds[1:], outputs[1:]):
            np.testing.assert_array_equal(out, outputs[0], err_msg=f"{build} vs {builds[0]}")


_RUN_ONE_BUILD = r"""
import sys
import numpy as np
import lstmcy
rng = np.random.default_rng(0)
out = []
for dtype in (np.float32, np.float64):
    # The last two have the weight gradients of their first layer in panels (I + H >= 256,
    # one with 4H a power of two).
    for T, B, I, H, L, bid in [(13, 5, 7, 37, 2, True), (20, 3, 4, 9, 1, False), (9, 4, 3, 70, 1, False),
                               (6, 3, 200, 70, 1, False), (5, 2, 192, 64, 2, True)]:
        D = 2 if bid else 1
        x = (rng.standard_normal((T, B, I)) * 3).astype(dtype)
        params = []
        for layer in range(L):
            for _ in range(D):
                params += [rng.standard_normal(s).astype(dtype) for s in
                           [(4 * H, I if layer == 0 else D * H), (4 * H, H), (4 * H,), (4 * H,)]]
        y, h_n, c_n, cache = lstmcy.lstm_forward(x, None, params, num_layers=L, bidirectional=bid)
        grads = lstmcy.lstm_backward(x, None, params, np.full_like(y, 0.3), h_n, c_n, *cache.saved(),
                                     num_layers=L, bidirectional=bid)
        out += [y, h_n, c_n, *grads[:3], *grads[3], *cache.i, *cache.tanhc]
np.savez(sys.argv[1], *out)
"""


def test_instruction_set_builds_agree(tmp_path):
    """The AVX2 and AVX-512 builds are bitwise identical (same summation order, one fused
    multiply-add per term in the recurrent products); the portable build multiplies and
    adds separately there, so it agrees to rounding."""
    builds = _dispatch.available_builds()
    if len(builds) == 1:
        pytest.skip("only the baseline build runs on this CPU")
    results = {}
    for build in builds:
        path = tmp_path / f"{build}.npz"
        subprocess.run([sys.executable, "-c", _RUN_ONE_BUILD, str(path)], check=True,
                       env=dict(os.environ, LSTMCY_KERNELS=build))
        results[build] = np.load(path)
    best = results[builds[0]]
    for build in builds[1:-1]:
        for name in best.files:
            np.testing.assert_array_equal(results[build][name], best[name], err_msg=f"{build} {name}")
    base = results["baseline"]
    for name in best.files:
        rtol = 1e-3 if best[name].dtype == np.float32 else 1e-9
        scale = np.abs(best[name]).max(initial=0)
        np.testing.assert_allclose(base[name], best[name], rtol=rtol, atol=rtol * scale,
                                   err_msg=f"baseline {name}")


_PACKED_MATMUL = r"""
import sys
import numpy as np
from lstmcy._engine.dispatch import kernels
rng = np.random.default_rng(3)
worst = 0.0
for dtype in (np.float32, np.float64):
    for m, k, n in [(1, 1, 1), (1, 32, 128), (5, 9, 33), (12, 7, 64), (13, 70, 280),
                    (25, 64, 17), (37, 3, 100), (64, 130, 31)]:
        a = rng.standard_normal((m, k)).astype(dtype)
        for trans in (False, True):
            w = rng.standard_normal((n, k) if trans else (k, n)).astype(dtype)
            full = a.astype(np.float64) @ (w.T if trans else w).astype(np.float64)
            for n0, width in ((0, n), (n // 3, n - n // 3 - n // 4)):
                if width <= 0:
                    continue
                c0 = rng.standard_normal((m, width)).astype(dtype)
                for accumulate in (False, True):
                    c = c0.copy()
                    kernels._packed_matmul(a, w, trans, c, accumulate, n0, width)
                    want = full[:, n0:n0 + width] + (c0 if accumulate else 0)
                    bound = np.abs(a).astype(np.float64) @ np.abs(w.T if trans else w)
                    err = np.abs(c - want) / (bound[:, n0:n0 + width] + np.abs(c0) * accumulate)
                    worst = max(worst, float(err.max() / np.finfo(dtype).eps))
print(worst)
"""


@pytest.mark.parametrize("build", _dispatch.available_builds())
def test_packed_gemm_matches_numpy(build):
    """The recurrent products' own GEMM, on every build: odd sizes (partial register blocks
    and panels), column ranges, both operand layouts, with and without accumulation. The
    error is measured against sum |a||w| in units of eps (a float64 product is the truth)."""
    out = subprocess.run([sys.executable, "-c", _PACKED_MATMUL], check=True, capture_output=True,
                         text=True, env=dict(os.environ, LSTMCY_KERNELS=build))
    worst = float(out.stdout)
    assert worst < 140, f"{build}: error {worst:.1f} eps of sum |a||w|"  # k <= 130 terms


_PACKED_ONE_ROW = r"""
import numpy as np
from lstmcy._engine.dispatch import kernels
rng = np.random.default_rng(4)
bad = []
for dtype in (np.float32, np.float64):
    # 1 to 9 panels of every build's width, with and without a partial last one.
    for k, n in [(1, 8), (7, 16), (32, 32), (33, 48), (128, 64), (9, 100), (64, 128), (5, 144), (3, 288)]:
        a = rng.standard_normal((6, k)).astype(dtype)
        for trans in (False, True):
            w = rng.standard_normal((n, k) if trans else (k, n)).astype(dtype)
            c0 = rng.standard_normal((6, n)).astype(dtype)
            for accumulate in (False, True):
                rows = c0.copy()
                kernels._packed_matmul(a, w, trans, rows, accumulate, 0, n)
                for r in range(6):
                    one = c0[r:r + 1].copy()
                    kernels._packed_matmul(a[r:r + 1], w, trans, one, accumulate, 0, n)
                    if one.tobytes() != rows[r:r + 1].tobytes():
                        bad.append((np.dtype(dtype).name, k, n, trans, accumulate, r))
print(bad)
"""


@pytest.mark.parametrize("build", _dispatch.available_builds())
def test_packed_gemm_row_alone_gives_the_same_bits(build):
    """A single row (the recurrences of a batch of one) takes its own path through the
    packed GEMM, several panels at a time; its bits must be those it gets among other
    rows, as the thread count's row groups never change a result."""
    out = subprocess.run([sys.executable, "-c", _PACKED_ONE_ROW], check=True, capture_output=True,
                         text=True, env=dict(os.environ, LSTMCY_KERNELS=build))
    assert out.stdout.strip() == "[]", f"{build}: rows whose bits differ alone: {out.stdout}"


_PACKED_SUM = r"""
import numpy as np
from lstmcy._engine.dispatch import kernels
rng = np.random.default_rng(6)
bad = []
for dtype in (np.float32, np.float64):
    # 1 to 9 panels, partial last ones; one row (its own path) and register blocks
    for m, k, k2, n in [(1, 1, 1, 8), (1, 32, 64, 128), (1, 3, 5, 100), (2, 7, 9, 16),
                        (5, 33, 17, 48), (16, 64, 128, 256), (13, 40, 8, 144), (32, 3, 64, 288)]:
        a, a2 = (rng.standard_normal((m, kk)).astype(dtype) for kk in (k, k2))
        w, w2 = (rng.standard_normal((n, kk)).astype(dtype) for kk in (k, k2))
        c = np.full((m, n), np.nan, dtype=dtype)
        kernels._packed_matmul2(a, w, a2, w2, c)
        one = np.zeros((m, n), dtype=dtype)
        kernels._packed_matmul(np.hstack([a, a2]), np.hstack([w, w2]), True, one, False)
        if c.tobytes() != one.tobytes():
            bad.append((np.dtype(dtype).name, m, k, k2, n))
print(bad)
"""


@pytest.mark.parametrize("build", _dispatch.available_builds())
def test_packed_sum_of_two_products_is_one_running_sum(build):
    """The forward's product with the input inside the recurrence (fused_input),
    x @ w_ih^T + h @ w_hh^T, sums every element over the first product's terms, then the
    second's: the bits of one product of the concatenated operands, [x | h] @ [w_ih | w_hh]^T
    (checked against numpy by test_packed_gemm_matches_numpy), one row alone included."""
    out = subprocess.run([sys.executable, "-c", _PACKED_SUM], check=True, capture_output=True,
                         text=True, env=dict(os.environ, LSTMCY_KERNELS=build))
    assert out.stdout.strip() == "[]", f"{build}: sums whose bits differ: {out.stdout}"


_GEMM_TN = r"""
import numpy as np
from lstmcy._engine.dispatch import KERNELS, kernels, set_cpu_facts
rng = np.random.default_rng(5)
worst, bad = 0.0, []
for dtype in (np.float32, np.float64):
    # M rows of dW (a 4 KiB multiple apart for 1024 float32 / 512 float64: the copied
    # path), n columns (partial panels), K summed rows (more than one pass of 128; at most
    # 128 over 8 panels or more: the copied path too on AVX-512).
    for K, M, n in [(1, 1, 1), (7, 5, 3), (130, 37, 67), (300, 26, 290), (129, 1024, 40),
                    (140, 512, 33), (100, 40, 300), (128, 29, 520)]:
        a = rng.standard_normal((K, M)).astype(dtype)
        b = rng.standard_normal((K, n)).astype(dtype)
        c0 = rng.standard_normal((M, n)).astype(dtype)
        bound = np.abs(a).T.astype(np.float64) @ np.abs(b)
        for accumulate in (False, True):
            c = c0.copy()
            kernels._gemm_tn(a, b, c, accumulate)
            want = a.T.astype(np.float64) @ b + (c0 if accumulate else 0)
            err = np.abs(c - want) / (bound + np.abs(c0) * accumulate)
            worst = max(worst, float(err.max() / np.finfo(dtype).eps))
        # K in two accumulating pieces: the running sum goes on, the same bits
        whole = c0.copy()
        kernels._gemm_tn(a, b, whole, True)
        split = c0.copy()
        h = max(1, K // 2)
        kernels._gemm_tn(a[:h].copy(), b[:h].copy(), split, True)
        if K > h:
            kernels._gemm_tn(a[h:].copy(), b[h:].copy(), split, True)
        if whole.tobytes() != split.tobytes():
            bad.append(("split K", np.dtype(dtype).name, K, M, n))
        # fewer rows (another stride: the other loop order where the core reads rows in
        # place): each row's bits unchanged
        if M > 3:
            part = c0[:M - 3].copy()
            kernels._gemm_tn(a[:, :M - 3].copy(), b, part, True)
            if part.tobytes() != whole[:M - 3].tobytes():
                bad.append(("rows", np.dtype(dtype).name, K, M, n))
        # fewer columns (fewer panels: the other loop order where the core reads rows in
        # place and K <= 128): the same bits
        if n > 64:
            cols = c0[:, :64].copy()
            kernels._gemm_tn(a, b[:, :64].copy(), cols, True)
            if cols.tobytes() != whole[:, :64].tobytes():
                bad.append(("columns", np.dtype(dtype).name, K, M, n))
        # either setting of the core (reading a's rows in place or copying them): the same bits
        for on in (True, False):
            kernels.set_weights_rows_in_place(on)
            other = c0.copy()
            kernels._gemm_tn(a, b, other, True)
            if other.tobytes() != whole.tobytes():
                bad.append(("in place" if on else "copied", np.dtype(dtype).name, K, M, n))
        set_cpu_facts(kernels, KERNELS)
print(worst, bad)
"""


@pytest.mark.parametrize("build", _dispatch.available_builds())
def test_weight_gradient_product_matches_numpy(build):
    """The weight gradients' own product, c (+)= a^T b with b in panels, on every build:
    against a float64 product (in units of eps of sum |a||b|), and the same bits when K is
    cut into accumulating pieces, when the rows or columns are fewer (the other loop order
    where the core reads rows in place), and with either setting of the core."""
    out = subprocess.run([sys.executable, "-c", _GEMM_TN], check=True, capture_output=True,
                         text=True, env=dict(os.environ, LSTMCY_KERNELS=build))
    worst, bad = out.stdout.split(" ", 1)
    assert float(worst) < 310, f"{build}: error {float(worst):.1f} eps of sum |a||b|"  # K <= 300
    assert bad.strip() == "[]", f"{build}: bits differ: {bad}"


def test_unknown_build_name_is_refused():
    with pytest.raises(ValueError, match="LSTMCY_KERNELS"):
        _dispatch.load("sse9")


def _case(layout, rng, T=7, B=5, I=6, H=19, L=2, bidirectional=False):
    D = 2 if bidirectional else 1
    lengths = np.array([7, 6, 6, 3, 1])
    batch_sizes = np.array([(lengths > t).sum() for t in range(T)])
    kwargs = dict(num_layers=L, bidirectional=bidirectional)
    if layout == "batch_first":
        x = rng.standard_normal((B, T, I))
        kwargs["batch_first"] = True
    elif layout == "time_major":
        x = rng.standard_normal((T, B, I))
    elif layout == "packed":
        x = rng.standard_normal((batch_sizes.sum(), I))
        kwargs["batch_sizes"] = batch_sizes
    else:
        x = rng.standard_normal((T * B, I))
        kwargs["batch_sizes"] = batch_sizes
    params = []
    for layer in range(L):
        for _ in range(D):
            params += [rng.standard_normal((4 * H, I if layer == 0 else D * H)) * 0.5,
                       rng.standard_normal((4 * H, H)) * 0.5, rng.standard_normal(4 * H),
                       rng.standard_normal(4 * H)]
    hx = (rng.standard_normal((L * D, B, H)), rng.standard_normal((L * D, B, H)))
    return x, hx, params, kwargs


@pytest.fixture
def threads():
    saved = lstmcy.get_num_threads()
    yield lstmcy.set_num_threads
    lstmcy.set_num_threads(saved)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("layout", ["batch_first", "time_major", "packed", "padded_2d"])
def test_thread_layouts_match_the_reference_and_each_other(threads, layout, bidirectional):
    x, hx, params, kwargs = _case(layout, np.random.default_rng(5), bidirectional=bidirectional)
    runs = []
    for n_threads in (1, 2):
        threads(n_threads)
        y, h_n, c_n, cache = lstmcy.lstm_forward(x, hx, params, **kwargs)
        dy = np.random.default_rng(1).standard_normal(y.shape)
        grads = lstmcy.lstm_backward(x, hx, params, dy, h_n, c_n, *cache.saved(), **kwargs)
        runs.append([y, h_n, c_n, *grads[:3], *grads[3], *cache.h, *cache.c])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)  # bitwise, 1 vs 2 threads
    y_ref, h_ref, c_ref, cache_ref = reference.lstm_forward(x, hx, params, **kwargs)
    dy = np.random.default_rng(1).standard_normal(y_ref.shape)
    grads_ref = reference.lstm_backward(x, hx, params, dy, h_n, c_n, *cache_ref.saved(), **kwargs)
    expected = [y_ref, h_ref, c_ref, *grads_ref[:3], *grads_ref[3], *cache_ref.h, *cache_ref.c]
    for got, ref in zip(runs[0], expected):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", ["batch_first", "time_major", "packed", "padded_2d"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plan_workspace_stays_within_required_workspace(layout, bidirectional, dtype):
    x, hx, params, kwargs = _case(layout, np.random.default_rng(2), bidirectional=bidirectional)
    x, hx = x.astype(dtype), tuple(a.astype(dtype) for a in hx)
    params = [p.astype(dtype) for p in params]
    plan = lstmcy.LSTMPlan()
    y, h_n, c_n, cache = plan.forward(x, hx, params, **kwargs)
    plan.backward(x, hx, params, np.ones_like(y), h_n, c_n, *cache.saved(), **kwargs)
    T, B, I, H = 7, 5, 6, 19
    needed = lstmcy.LSTMPlan.required_workspace(
        T, B, I, H, num_layers=kwargs["num_layers"], bidirectional=bidirectional,
        batch_sizes=kwargs.get("batch_sizes"), dtype=dtype)
    assert 0 < plan.workspace_size <= needed


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_required_workspace_bounds_the_fused_input_product(dtype):
    # Layers whose forward packs w_ih beside w_hh (_schedule.fused_input), both layers:
    # 6 sequences, 40 input features, 2 * 24 into the second layer.
    T, B, I, H = 5, 6, 40, 24
    from lstmcy._engine import schedule as _schedule
    assert _schedule.fused_input(B, I, H, np.dtype(dtype).itemsize)
    assert _schedule.fused_input(B, 2 * H, H, np.dtype(dtype).itemsize)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    params = [rng.standard_normal(shape).astype(dtype) for layer_in in (I, 2 * H)
              for _ in range(2) for shape in ((4 * H, layer_in), (4 * H, H), (4 * H,), (4 * H,))]
    plan = lstmcy.LSTMPlan()
    y, h_n, c_n, cache = plan.forward(x, None, params, num_layers=2, bidirectional=True)
    plan.backward(x, None, params, np.ones_like(y), h_n, c_n, *cache.saved(), num_layers=2,
                  bidirectional=True)
    needed = lstmcy.LSTMPlan.required_workspace(T, B, I, H, num_layers=2, bidirectional=True,
                                                dtype=dtype, backward=True)
    assert 0 < plan.workspace_size <= needed


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_input_gradient_fits_the_workspace_and_matches_the_reference(dtype):
    # Layers whose backward packs w_ih for dx (_schedule.packed_dx), both layers: 70 input
    # features, 2 * 130 into the second layer.
    T, B, I, H = 5, 6, 70, 130
    from lstmcy._engine import schedule as _schedule
    assert _schedule.packed_dx(I, H) and _schedule.packed_dx(2 * H, H)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    params = [(0.3 * rng.standard_normal(shape)).astype(dtype) for layer_in in (I, 2 * H)
              for _ in range(2) for shape in ((4 * H, layer_in), (4 * H, H), (4 * H,), (4 * H,))]
    kwargs = dict(num_layers=2, bidirectional=True)
    plan = lstmcy.LSTMPlan()
    y, h_n, c_n, cache = plan.forward(x, None, params, **kwargs)
    dy = rng.standard_normal(y.shape).astype(dtype)
    got = plan.backward(x, None, params, dy, h_n, c_n, *cache.saved(), **kwargs)
    needed = lstmcy.LSTMPlan.required_workspace(T, B, I, H, dtype=dtype, backward=True, **kwargs)
    assert 0 < plan.workspace_size <= needed
    want = reference.lstm_backward(x, None, params, dy, h_n, c_n, *cache.saved(), **kwargs)
    tolerance = 2e-5 if dtype == np.float32 else 1e-12  # relative to the largest |dx|
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=tolerance * np.abs(want[0]).max())


def test_a_backward_without_dx_reserves_no_packed_input_weights():
    # A one-layer backward of a packed_dx shape that computes only the parameter gradients
    # (a model whose input needs no gradient) never packs w_ih: its workspace has no room
    # for it, and its gradients are bitwise those of a call that computes dx too.
    T, B, I, H = 3, 4, 70, 130
    from lstmcy._engine import schedule as _schedule
    assert _schedule.packed_dx(I, H)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    params = [(0.3 * rng.standard_normal(shape)).astype(np.float32)
              for shape in ((4 * H, I), (4 * H, H), (4 * H,), (4 * H,))]
    y, h_n, c_n, cache = lstmcy.lstm_forward(x, None, params)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    sizes, grads = {}, {}
    for want_dx in (True, False):
        plan = lstmcy.LSTMPlan(n_threads=2)
        out = plan.backward(x, None, params, dy, h_n, c_n, *cache.saved(),
                            output_mask=(want_dx, False, False, True))
        sizes[want_dx], grads[want_dx] = plan.workspace_size, out[3]
        assert (out[0] is not None) == want_dx
    packed_w_ih = 4 * H * I * 4  # float32, before the panels' padding
    assert sizes[True] - sizes[False] >= packed_w_ih
    for with_dx, without in zip(grads[True], grads[False]):
        np.testing.assert_array_equal(with_dx, without)


@pytest.mark.parametrize("dtype,H", [(np.float32, 256), (np.float64, 128)])
def test_padded_gate_rows_change_no_bit(dtype, H):
    # 4H values a row are 4 KiB: the gates (forward) and gate gradients (backward) get a
    # padded row stride (lstmcy._engine.schedule.gate_row_stride), which every product reads or
    # writes; the results are bitwise those of unpadded rows, on one thread and several.
    from lstmcy._engine import schedule as _schedule
    assert _schedule.gate_row_stride(H, np.dtype(dtype)) > 4 * H
    assert _schedule.gate_row_stride(H + 1, np.dtype(dtype)) == 4 * (H + 1)
    T, B, I = 4, 5, 70
    rng = np.random.default_rng(6)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    params = [(rng.standard_normal(shape) / np.sqrt(H)).astype(dtype) for _ in range(2)
              for shape in ((4 * H, I), (4 * H, H), (4 * H,), (4 * H,))]

    def grads(n_threads, schedules=None):
        plan = lstmcy.LSTMPlan(n_threads=n_threads, schedules=schedules)
        y, h_n, c_n, cache = plan.forward(x, None, params, bidirectional=True)
        dy = np.cos(np.arange(y.size)).reshape(y.shape).astype(dtype)
        dx, dh0, dc0, dparams = plan.backward(x, None, params, dy, h_n, c_n, *cache.saved(),
                                              bidirectional=True)
        return [y, h_n, c_n, dx, dh0, dc0, *dparams]

    padded = {n: grads(n) for n in (1, 2, 3)}
    plain = grads(1, _schedule.SchedulePolicy(row_stride=lambda H, dtype: 4 * H))
    for n, got in padded.items():
        for k, (a, b) in enumerate(zip(got, plain)):
            assert a.tobytes() == b.tobytes(), f"output {k} on {n} threads"


def _kernel_args(kind, batch_first=False):
    """The kernel object of a small one-layer call of ``kind`` ("forward" or "backward",
    made by a plan) and the arguments of its ``run`` for that call, built here."""
    rng = np.random.default_rng(0)
    T, B, I, H = 5, 3, 4, 2
    x = rng.standard_normal((B, T, I) if batch_first else (T, B, I))
    params = [rng.standard_normal(s) for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    plan = lstmcy.LSTMPlan(n_threads=1)
    for _ in range(2):  # the second time on buffers that do not grow (which drops setups)
        y, h_n, c_n, cache = plan.forward(x, None, params, batch_first=batch_first)
        if kind == "backward":
            plan.backward(x, None, params, np.ones_like(y), None, None, *cache.saved(),
                          batch_first=batch_first)
    call = next(c for s in plan._setups.values() for c in s.by_threads.values()
                if type(c).__name__ == kind.capitalize() + "Layer")
    # The row tables of x and y: time-major rows t*B + b, batch-first b*T + t.
    step_row = np.arange(T) * (1 if batch_first else B)
    stride = T if batch_first else 1
    steps = (np.full(T, B, dtype=np.intp), np.arange(T, dtype=np.intp) * B)
    rows = (np.ascontiguousarray(x.reshape(T * B, I)), step_row.astype(np.intp), stride)
    out = (np.zeros((T * B, H)), step_row.astype(np.intp), stride)
    zeros = [np.zeros((1, B, H)) for _ in range(4)]
    saved = tuple(rng.standard_normal((1, T * B, H)) for _ in range(7))
    w_ih, w_hh = params[0][None], params[1][None]
    if kind == "forward":
        args = [rows, out, (w_ih, w_hh, (params[2] + params[3])[None], np.zeros((1, 0, H))),
                tuple(zeros[:3]), saved, steps]
    else:
        args = [rows, out, np.zeros((T * B, I)), (w_ih, w_hh, np.zeros((1, 0, H))),
                tuple(zeros), saved,
                (np.zeros((1, 4 * H, I)), np.zeros((1, 4 * H, H)), np.zeros((1, 4 * H)),
                 np.zeros((1, 0, H))), steps]
    return call, args


@pytest.mark.parametrize("kind", ["forward", "backward"])
def test_kernels_refuse_saved_activations_of_the_wrong_shape(kind):
    # The kernel objects check the seven saved arrays themselves (defence in depth behind
    # the Python layer's validation): a wrong count or shape is a ValueError naming it.
    call, args = _kernel_args(kind)
    index = next(k for k, a in enumerate(args) if isinstance(a, tuple) and len(a) == 7)
    saved = args[index]
    wrong = list(saved)
    wrong[4] = np.ascontiguousarray(saved[4][:, 1:])  # h one row short
    args[index] = tuple(wrong)
    with pytest.raises(ValueError, match=r"saved h must be \[1, 15, 2\]"):
        call.run(*args)
    args[index] = tuple(saved[:6])
    with pytest.raises(ValueError, match="must hold the 7 activations"):
        call.run(*args)


@pytest.mark.parametrize("kind", ["forward", "backward"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_kernels_refuse_row_tables_that_run_past_their_arrays(kind, batch_first):
    # Defence in depth behind the Python checks: every row a step table names (x and y in
    # the forward, x and dy in the backward) must lie in its array, and no step may have
    # more rows than h0. A short array is a ValueError, not a read or write past its end.
    call, args = _kernel_args(kind, batch_first=batch_first)
    for index in (0, 1):
        short = list(args)
        rows, step_row, stride = args[index]
        short[index] = (np.ascontiguousarray(rows[:-1]), step_row, stride)
        with pytest.raises(ValueError, match="must hold every row their step tables name"):
            call.run(*short)
    wide = list(args)
    sizes = args[-1][0].copy()
    sizes[0] += 1  # one row more than h0 has at the first step
    wide[-1] = (sizes, args[-1][1])
    with pytest.raises(ValueError, match="batch_sizes must be at most B"):
        call.run(*wide)
    call.run(*args)  # the arguments as given still run


@pytest.mark.parametrize("kind", ["forward", "backward"])
def test_a_kernel_object_is_set_up_once(kind):
    call, _ = _kernel_args(kind)
    flags = (True, False) if kind == "forward" else (True, True, False)
    with pytest.raises(ValueError, match="is set up once"):
        call.__init__((5, 3, 15, 1, 4, 2, 2), *flags, call.schedule, call.workspace, 1)


@pytest.mark.parametrize("kind", ["forward", "backward"])
def test_a_kernel_object_keeps_its_work_buffers(kind):
    # The object holds the buffers its struct points into: with the plan that made them
    # gone, a call still runs in them (under AddressSanitizer: no use after free) and
    # gives the same bits.
    import gc
    call, args = _kernel_args(kind)
    states = args[3] if kind == "forward" else args[4]  # (c and the gradients: in and out)
    for state in states:
        state[...] = 0
    call.run(*args)
    first = [np.array(a) for a in _outputs(kind, args)]
    gc.collect()
    assert all(sys.getrefcount(w) > 1 for w in call.workspace)
    for state in states:
        state[...] = 0
    call.run(*args)
    for a, b in zip(first, _outputs(kind, args)):
        assert a.tobytes() == b.tobytes()


def _outputs(kind, args):
    """The arrays a kernel object's call writes, from its ``run`` arguments."""
    if kind == "forward":
        return [args[1][0], *args[3][1:]]
    return [args[2], *args[4][2:], *args[6]]


def test_a_kernel_object_refuses_a_second_call_while_one_runs():
    # One object, two threads: the second call raises instead of sharing the first's
    # buffers and synchronisation. The first call is long enough to be caught running.
    import threading
    rng = np.random.default_rng(1)
    T, B, I, H = 40000, 2, 8, 32
    x = rng.standard_normal((T, B, I))
    params = [rng.standard_normal(s) * 0.1 for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    plan = lstmcy.LSTMPlan(n_threads=1)
    for _ in range(2):
        plan.forward(x, None, params, train=False)
    call = next(c for s in plan._setups.values() for c in s.by_threads.values())
    steps = (np.full(T, B, dtype=np.intp), np.arange(T, dtype=np.intp) * B)
    rows = np.arange(T, dtype=np.intp) * B
    args = ((x.reshape(T * B, I), rows, 1), (np.zeros((T * B, H)), rows, 1),
            (params[0][None], params[1][None], (params[2] + params[3])[None],
             np.zeros((1, 0, H))),
            tuple(np.zeros((1, B, H)) for _ in range(3)),
            tuple(np.zeros((1, 0, H)) for _ in range(7)), steps)
    worker = threading.Thread(target=call.run, args=args, daemon=True)
    refused = 0
    for _ in range(20):  # until a call is caught running
        worker = threading.Thread(target=call.run, args=args, daemon=True)
        worker.start()
        while worker.is_alive() and not refused:
            if call.running:
                with pytest.raises(RuntimeError, match="already running a call"):
                    call.run(*args)
                refused += 1
        worker.join(timeout=120)
        assert not worker.is_alive(), "the first call did not end"
        if refused:
            break
    assert refused == 1
    assert not call.running


def _per_sample_case(rng, dtype, K, B, G, F):
    """Strided inputs as the grad samplers pass them: gradient rows padded to a wider
    stride, values a step-shifted view, first terms with rows of their own stride."""
    grads = rng.standard_normal((K, B, G + 3)).astype(dtype)[:, :, :G]
    values = rng.standard_normal((K + 1, B, F)).astype(dtype)[1:]
    first_grads = rng.standard_normal((B, G + 1)).astype(dtype)[:, :G]
    first_values = rng.standard_normal((B, F)).astype(dtype)
    return grads, values, first_grads, first_values


# (K, B, G, F); K = 150 crosses gemm_tn's blocks of 128 steps.
PER_SAMPLE_SHAPES = [(50, 6, 512, 32), (7, 3, 20, 5), (1, 2, 8, 3), (0, 2, 8, 3), (5, 1, 4, 1),
                     (9, 4, 33, 17), (3, 0, 8, 3), (3, 2, 8, 0), (150, 3, 40, 24)]


@pytest.mark.parametrize("build", _dispatch.available_builds())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_per_sample_products_match_numpy_on_any_thread_count(build, dtype):
    """out[b] = scale * (first_grads[b]^T first_values[b] + sum_k grads[k, b]^T
    values[k, b]) and bias[b] = scale * sum_k grads[k, b], on strided inputs: against a
    float64 product (in units of eps of the sum of |terms|), and the same bits on 1, 2
    and 5 threads (the pool told of 5 CPUs, so that all five run parts at once)."""
    from lstmcy import _threadpool
    kernels = _dispatch.load(build)
    cpus = _threadpool.cpu_count()
    _threadpool.set_cpu_count(5)
    try:
        _per_sample_sweep(kernels, dtype)
    finally:
        _threadpool.set_cpu_count(cpus)


def _per_sample_sweep(kernels, dtype):
    rng = np.random.default_rng(7)
    eps = np.finfo(dtype).eps
    for K, B, G, F in PER_SAMPLE_SHAPES:
        grads, values, fg, fv = _per_sample_case(rng, dtype, K, B, G, F)
        g64, v64 = grads.astype(np.float64), values.astype(np.float64)
        for first in (False, True):
            want = np.einsum("kbg,kbf->bgf", g64, v64)
            bound = np.einsum("kbg,kbf->bgf", np.abs(g64), np.abs(v64))
            if first:
                want += np.einsum("bg,bf->bgf", fg.astype(np.float64), fv)
                bound += np.einsum("bg,bf->bgf", np.abs(fg.astype(np.float64)), np.abs(fv))
            results = []
            for n_threads, scale in ((1, -2.5), (2, -2.5), (5, -2.5), (2, 1.0)):
                out = np.full((B, G, F), np.nan, dtype)
                bias = np.full((B, G), np.nan, dtype)
                kernels.per_sample_products(grads, values, out, scale, n_threads,
                                            fg if first else None, fv if first else None, bias)
                err = np.abs(out - scale * want) / (abs(scale) * bound + np.finfo(dtype).tiny)
                assert float(err.max(initial=0)) < (K + 2) * 2 * eps, (K, B, G, F, first)
                np.testing.assert_allclose(bias, scale * g64.sum(0), rtol=(K + 1) * eps,
                                           atol=(K + 1) * 4 * eps * np.abs(g64).sum(0).max(
                                               initial=0))
                if scale != 1:
                    results.append((out.tobytes(), bias.tobytes()))
            assert results[1:] == results[:-1], ("bits differ between thread counts",
                                                 K, B, G, F)


def test_per_sample_products_same_bits_in_the_vector_builds():
    """The AVX2 and AVX-512 builds give the same bits (as the layer calls do)."""
    builds = [b for b in _dispatch.available_builds() if b != "baseline"]
    if len(builds) < 2:
        pytest.skip(f"one vector build runs on this CPU: {builds}")
    outs = {}
    for name in builds:
        grads, values, fg, fv = _per_sample_case(np.random.default_rng(3), np.float32, 20, 4,
                                                 40, 24)
        out = np.empty((4, 40, 24), np.float32)
        bias = np.empty((4, 40), np.float32)
        _dispatch.load(name).per_sample_products(grads, values, out, 3.0, 2, fg, fv, bias)
        outs[name] = out.tobytes() + bias.tobytes()
    assert len(set(outs.values())) == 1, builds


def test_per_sample_products_refuse_bad_arrays():
    """Mismatched shapes, dtypes, layouts and read-only outputs are ValueErrors naming the
    argument; nothing is written."""
    kernels = _dispatch.load()
    rng = np.random.default_rng(0)
    grads, values, fg, fv = _per_sample_case(rng, np.float32, 4, 3, 8, 5)
    out = np.zeros((3, 8, 5), np.float32)
    cases = [
        ((grads[:, :2], values, out), "values"),
        ((grads, values[:, :, :4], out), "out"),
        ((grads, values.astype(np.float64), out), "values"),
        ((grads.astype(np.float16), values, out), "grads"),
        ((grads[:, :, ::2], values[:, :, :4], np.zeros((3, 4, 4), np.float32)), "grads"),
        ((grads, values, out.transpose(0, 2, 1).copy().transpose(0, 2, 1)), "out"),
        ((grads, values, out[::-1]), "out"),
        ((grads, values[::-1], out), "values"),
        ((grads, values, out, 1.0, 1, fg, None), "first_grads and first_values"),
        ((grads, values, out, 1.0, 1, fg, fv[:2]), "first_values"),
        ((grads, values, out, 1.0, 1, None, None, np.zeros((3, 7), np.float32)), "bias"),
        ((list(grads), values, out), "grads"),
    ]
    readonly = out.copy()
    readonly.flags.writeable = False
    cases.append(((grads, values, readonly), "out"))
    # Outputs that overlap an input: written while other samples still read it.
    shared = np.zeros(3 * 8 * 5 + 4 * 3 * 8, np.float32)
    cases.append(((shared[96:192].reshape(4, 3, 8), values, shared[:120].reshape(3, 8, 5)),
                  "out: overlaps grads"))
    cases.append(((grads, values, out, 1.0, 1, None, None, out.reshape(-1)[:24].reshape(3, 8)),
                  "bias: overlaps out"))
    for args, name in cases:
        args = args + (1.0, 1)[len(args) - 3:] if len(args) < 5 else args
        with pytest.raises(ValueError, match=name):
            kernels.per_sample_products(*args)
    assert not out.any()
