"""Long and tall problems: 100,000 steps of a few sequences, and 2M rows (T*B) of small ones.

At these sizes the kernels' bookkeeping runs at scale: step tables, row offsets past
2**31 bytes' worth of elements in the saved block, the events, claims and trace of a
call. PyTorch's float64 autograd over 100,000 steps would take minutes, so every run is
checked exactly on windows of K steps, each against PyTorch float64 autograd:

* forward: started from lstmcy's own saved state at the step before a window (or from
  ``hx``), PyTorch must reproduce lstmcy's outputs over the window, at the first, a
  middle and the last steps of every sequence;
* backward, head: with ``dy`` on the first K steps only and no ``dh_n``/``dc_n``, every
  gradient comes from those steps: ``dx`` there, ``dh0``, ``dc0`` and ``dparams`` equal
  PyTorch's backward of the first K steps alone, and ``dx`` is exactly 0 after them;
* backward, tail: with ``dy`` on the last K steps of every sequence and random
  ``dh_n``/``dc_n``, ``dx`` over those steps equals PyTorch's backward of the window
  from lstmcy's saved state.

float32 runs are held to PyTorch float64 on the same float32 values (max-norm relative
2e-5), float64 runs to 1e-10. Each test uses its own plan and drops it, so the suite does
not keep gigabytes of work buffers.
"""
import gc
import os

import numpy as np
import pytest

import lstmcy
from torch_oracle import make_params, torch_lstm

K = 12  # steps per window
SIZES = {
    # name: (T, B, I, H)
    "long": (100_000, 2, 3, 4),
    "tall": (8_192, 256, 8, 16),
}
LAYOUTS = ["time_major", "packed", "padded_2d"]
RTOL = {np.float32: 2e-5, np.float64: 1e-10}


class Problem:
    """A random problem of one size and layout: time-major values and the layout's arrays."""

    def __init__(self, size, layout, dtype, seed=0):
        T, B, I, H = SIZES[size]
        rng = np.random.default_rng(seed)
        self.T, self.B, self.I, self.H, self.layout, self.dtype = T, B, I, H, layout, dtype
        if layout == "time_major":
            self.lengths = np.full(B, T)
            self.batch_sizes = None
        else:
            lengths = np.sort(rng.integers(T // 2, T + 1, size=B))[::-1].copy()
            lengths[0] = T
            self.lengths = lengths
            self.batch_sizes = (lengths[None, :] > np.arange(T)[:, None]).sum(1)
        self.x = rng.uniform(-1, 1, (T, B, I)).astype(dtype)
        self.params = make_params(rng, 1, 1, I, H, True, dtype)
        self.h0 = rng.uniform(-1, 1, (1, B, H)).astype(dtype)
        self.c0 = rng.uniform(-1, 1, (1, B, H)).astype(dtype)
        self.rng = rng

    def to_layout(self, values):
        """``[T, B, F]`` time-major values in the layout (packed: the valid rows only)."""
        if self.layout == "time_major":
            return values
        if self.layout == "padded_2d":
            return values.reshape(self.T * self.B, -1).copy()
        valid = np.arange(self.T)[:, None] < self.lengths[None, :]
        return values[valid]  # row-major over (t, b): PyTorch's packed order

    def from_layout(self, array):
        """The layout's array back as ``[T, B, F]`` time-major (invalid steps 0)."""
        if self.layout == "time_major":
            return array
        if self.layout == "padded_2d":
            return array.reshape(self.T, self.B, -1)
        out = np.zeros((self.T, self.B, array.shape[-1]), array.dtype)
        out[np.arange(self.T)[:, None] < self.lengths[None, :]] = array
        return out

    def kwargs(self):
        return dict(num_layers=1) if self.batch_sizes is None else dict(
            num_layers=1, batch_sizes=self.batch_sizes)


def close(actual, desired, rtol, what):
    desired = np.asarray(desired, np.float64)
    scale = max(float(np.abs(desired).max(initial=0.0)), 1e-300)
    err = float(np.abs(np.asarray(actual, np.float64) - desired).max(initial=0.0))
    assert err <= rtol * scale, f"{what}: max error {err:.3g} relative to {scale:.3g}"


def window_states(problem, saved, t0, b):
    """Sequence b's ``(h, c)`` before step t0 (``hx`` for t0 = 0), as ``[1, 1, H]``."""
    if t0 == 0:
        return problem.h0[:, b:b + 1], problem.c0[:, b:b + 1]
    h, c = saved
    return h[t0 - 1, b][None, None], c[t0 - 1, b][None, None]


def run(problem, n_threads, trace=False):
    plan = lstmcy.LSTMPlan(n_threads=n_threads)
    if trace:
        plan.trace = []
    x = problem.to_layout(problem.x)
    y, h_n, c_n, cache = plan.forward(x, (problem.h0, problem.c0), problem.params,
                                      **problem.kwargs())
    return plan, x, y, h_n, c_n, cache


@pytest.fixture(autouse=True)
def _release_buffers():
    yield
    lstmcy.release_workspaces()
    gc.collect()


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("size", sorted(SIZES))
def test_long_and_tall_problems_match_pytorch_on_windows(size, dtype, layout, n_threads):
    if size == "tall" and os.environ.get("LSTMCY_BUILD_KIND") in ("debug", "tsan"):
        pytest.skip("2M rows take up to a minute each in the -O0 debug build and minutes "
                    "under ThreadSanitizer; the 100,000-step problems run there, the 2M-row "
                    "ones in the release and ASan builds")
    problem = Problem(size, layout, dtype)
    T, B, H = problem.T, problem.B, problem.H
    rtol = RTOL[dtype]
    plan, x, y, h_n, c_n, cache = run(problem, n_threads, trace=n_threads == 2)
    saved = cache.saved()
    h_saved = np.asarray(saved[4][0]).reshape(T, B, H)
    c_saved = np.asarray(saved[5][0]).reshape(T, B, H)
    y3 = problem.from_layout(y)
    # Sequences to check: the longest, the shortest, and (tall) one in the middle.
    checked = sorted({0, B - 1, B // 2})

    # Forward on windows at the start, the middle and the end of each checked sequence.
    for b in checked:
        n = problem.lengths[b]
        for t0 in (0, n // 2, n - K):
            h, c = window_states(problem, (h_saved, c_saved), t0, b)
            ref = torch_lstm(problem.x[t0:t0 + K, b:b + 1], (h, c), problem.params)
            close(y3[t0:t0 + K, b:b + 1], ref.y, rtol, f"y of sequence {b} at {t0}")
        close(h_n[0, b], y3[n - 1, b], 0, f"h_n of sequence {b}")
        close(c_n[0, b], c_saved[n - 1, b], 0, f"c_n of sequence {b}")

    # Backward, head: dy on the first K steps only (every sequence is at least K long).
    dy3 = np.zeros((T, B, H), dtype)
    dy3[:K] = problem.rng.uniform(-1, 1, (K, B, H))
    dx, dh0, dc0, dparams = plan.backward(
        x, (problem.h0, problem.c0), problem.params, problem.to_layout(dy3), None, None,
        *saved, **problem.kwargs())
    dx3 = problem.from_layout(dx)
    ref = torch_lstm(problem.x[:K], (problem.h0, problem.c0), problem.params, dy=dy3[:K])
    close(dx3[:K], ref.dx, rtol, "dx over the first steps")
    assert not dx3[K:].any(), "dx after the steps that have a gradient"
    close(dh0, ref.dh_prev, rtol, "dh0")
    close(dc0, ref.dc_prev, rtol, "dc0")
    for k, (got, want) in enumerate(zip(dparams, ref.dparams)):
        close(got, want, rtol, f"dparams[{k}]")

    # Backward, tail: dy on the last K steps of every sequence, dh_n and dc_n given.
    dy3 = np.zeros((T, B, H), dtype)
    for b in range(B):
        n = problem.lengths[b]
        dy3[n - K:n, b] = problem.rng.uniform(-1, 1, (K, H))
    dh_n = problem.rng.uniform(-1, 1, (1, B, H)).astype(dtype)
    dc_n = problem.rng.uniform(-1, 1, (1, B, H)).astype(dtype)
    dx = plan.backward(x, (problem.h0, problem.c0), problem.params, problem.to_layout(dy3),
                       dh_n, dc_n, *saved, **problem.kwargs())[0]
    dx3 = problem.from_layout(dx)
    for b in checked:
        n = problem.lengths[b]
        h, c = window_states(problem, (h_saved, c_saved), n - K, b)
        ref = torch_lstm(problem.x[n - K:n, b:b + 1], (h, c), problem.params,
                         dy=dy3[n - K:n, b:b + 1], dh=dh_n[:, b:b + 1], dc=dc_n[:, b:b + 1])
        close(dx3[n - K:n, b:b + 1], ref.dx, rtol, f"dx over the last steps of sequence {b}")

    if plan.trace is not None:
        # Every kernel call reported its tasks (the count is read before the call's
        # synchronisation memory is freed).
        assert [kind for kind, _, _ in plan.trace] == ["forward", "backward", "backward"]
        for kind, _, entries in plan.trace:
            assert entries.shape[0] > 0 and (entries[:, 6] >= entries[:, 5]).all(), kind
