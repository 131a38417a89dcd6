"""Result arrays come from a ResultMemory that reuses a buffer once every array made from it is gone:
a result the caller still holds (or any view of it) must never be overwritten."""
import gc
import sys

import numpy as np
import pytest

import lstmcy
from lstmcy._engine import results as _results
from lstmcy._engine.results import ResultMemory


def _big(memory, value=0.0, shape=(256, 128)):  # 128 KiB of float32: reused
    array = memory.empty(shape, np.float32)
    array.fill(value)
    return array


def test_a_dropped_buffer_is_reused():
    memory = ResultMemory()
    address = _big(memory).ctypes.data  # the array is dropped at once
    again = _big(memory)
    assert again.ctypes.data == address
    assert len(memory._buffers) == 1


@pytest.mark.parametrize("make_view", [
    lambda a: a, lambda a: a[::2], lambda a: a.T, lambda a: a.reshape(-1)[5:],
    lambda a: a.view(np.int32), lambda a: a[1:].T[::3], memoryview,
    lambda a: np.asarray(a), lambda a: [a[0]],  # a row view inside a container
])
def test_a_buffer_with_any_live_view_is_not_reused(make_view):
    memory = ResultMemory()
    first = _big(memory, 1.0)
    kept = make_view(first)
    del first
    second = _big(memory, 2.0)  # must not land in the buffer `kept` still sees
    seen = np.asarray(kept[0] if isinstance(kept, list) else kept)
    values = seen.view(np.float32) if seen.dtype == np.int32 else seen
    assert values.dtype == np.float32 and np.all(values == 1.0)
    assert len(memory._buffers) == 2
    del kept, seen, values
    gc.collect()
    third = _big(memory, 3.0)
    assert len(memory._buffers) == 2  # the first buffer is free again and serves `third`
    assert np.all(second == 2.0) and np.all(third == 3.0)


def test_the_free_refcount_matches_this_interpreter():
    memory = ResultMemory()
    array = _big(memory)
    # Counted outside the asserts: pytest's assertion rewriting keeps operands alive.
    in_use = sys.getrefcount(memory._buffers[0])
    del array
    free = sys.getrefcount(memory._buffers[0])
    assert (in_use, free) == (_results._FREE_REFCOUNT + 1, _results._FREE_REFCOUNT)  # + array.base


def test_small_requests_and_zeros():
    memory = ResultMemory()
    small = memory.empty((3, 4), np.float64)
    assert small.shape == (3, 4) and small.flags.c_contiguous and memory._buffers == []  # not pooled
    zeros = memory.zeros((300, 300), np.float64)
    assert zeros.shape == (300, 300) and zeros.flags.c_contiguous and not zeros.any()


@pytest.mark.parametrize("shape", [(300, 301), (2, 3, 5000), (128, 129)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reused_arrays_start_on_a_cache_line(shape, dtype):
    # Also a pooled buffer served again, and a buffer serving a smaller request.
    memory = ResultMemory()
    for request in (shape, shape, shape[:-1] + (shape[-1] - 1,)):
        array = memory.empty(request, dtype)
        assert array.shape == request and array.dtype == dtype and array.flags.c_contiguous
        assert array.ctypes.data % _results.ALIGN == 0
        array[...] = 1  # the whole view is writable memory of the buffer
        del array
    assert len(memory._buffers) == 1


@pytest.mark.parametrize("shape", [(3, 5), (1,), (16, 64), (0, 7)])
def test_aligned_empty(shape):
    for _ in range(5):
        array = _results.aligned_empty(shape, np.float32)
        assert array.shape == shape and array.flags.c_contiguous and array.flags.writeable
        assert array.size == 0 or array.ctypes.data % _results.ALIGN == 0


def test_aligned_empty_uses_the_given_buffer():
    buffer = np.empty(10 * 8 + _results.ALIGN - 1, np.uint8)
    array = _results.aligned_empty((2, 5), np.float64, buffer)
    assert array.base is buffer and array.ctypes.data % _results.ALIGN == 0
    with pytest.raises(ValueError):  # a buffer too small for the shape after aligning
        _results.aligned_empty((2, 5), np.float64, np.empty(8, np.uint8))


def test_free_buffers_beyond_the_cap_are_dropped():
    memory = ResultMemory()
    held = [_big(memory) for _ in range(_results._MAX_BUFFERS + 5)]
    assert len(memory._buffers) == _results._MAX_BUFFERS + 5  # all in use: none dropped
    del held
    _big(memory, shape=(512, 512))  # a new size: appended, then free ones trimmed
    assert len(memory._buffers) <= _results._MAX_BUFFERS


def test_memory_once_held_by_dropped_results_goes_back():
    memory = ResultMemory()
    held = [_big(memory, shape=(1024, 256)) for _ in range(60)]  # 60 MiB in use
    assert memory.nbytes == 60 * (2**20 + _results.ALIGN - 1)  # each with room to align
    del held
    _big(memory, shape=(1024, 256))  # reuses one; the rest stays while 60 MiB is recent use
    assert memory.nbytes == 60 * (2**20 + _results.ALIGN - 1)
    for _ in range(_results._USE_WINDOW):  # the big use leaves the window: the rest goes back
        _big(memory, shape=(1024, 256))
    assert memory.nbytes <= 2**20 + _results._MAX_FREE_EXTRA_BYTES + 2**20
    assert memory.trims > 0


def test_a_training_loop_larger_than_the_free_allowance_reuses_its_buffers():
    """Between two steps everything is free for a moment; the next step must find its
    buffers again, also when its results are more than the free allowance (with the
    allowance measured from the bytes held at that moment, they were dropped and mapped
    afresh every step)."""
    import weakref

    memory = ResultMemory(max_free_extra_bytes=2 * 2**20)

    def step():  # a forward's results (3 MiB) kept for the backward's (3 MiB), then dropped
        forward = [_big(memory, shape=(1024, 256)) for _ in range(3)]
        backward = [_big(memory, shape=(1024, 256)) for _ in range(3)]
        return [weakref.ref(a.base) for a in forward + backward]

    first = step()
    trims = memory.trims
    for _ in range(20):
        now = step()
        assert all(ref() is not None for ref in first), "a buffer was dropped between steps"
        assert {id(ref()) for ref in now} == {id(ref()) for ref in first}
    assert memory.nbytes == 6 * (2**20 + _results.ALIGN - 1)
    # Nothing to drop, so no trim pass either (each is a pass over every buffer).
    assert memory.trims == trims


def test_a_buffer_is_not_much_larger_than_the_array_it_serves():
    memory = ResultMemory()
    big = _big(memory, shape=(1024, 256))
    address = big.ctypes.data
    del big
    small = _big(memory, shape=(512, 256))  # half the size: a new buffer, not the 1 MiB one
    assert small.ctypes.data != address and small.base.nbytes == small.nbytes + _results.ALIGN - 1


def _problem(rng, T=30, B=40, I=24, H=48):
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    params = [(rng.standard_normal(s) * 0.3).astype(np.float32)
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    return x, params


def test_results_held_by_the_caller_survive_later_calls():
    rng = np.random.default_rng(0)
    x, params = _problem(rng)
    first = lstmcy.lstm_forward(x, None, params)
    snapshot = [a.copy() for a in first[:3]] + [a.copy() for a in first[3].saved()]
    dy = rng.standard_normal(first[0].shape).astype(np.float32)
    grads = lstmcy.lstm_backward(x, None, params, dy, None, None, *first[3].saved())
    grad_snapshot = [grads[0].copy()] + [g.copy() for g in grads[3]]
    for k in range(3):  # later calls with other inputs, results dropped each time
        x2, params2 = _problem(rng)
        out = lstmcy.lstm_forward(x2, None, params2)
        lstmcy.lstm_backward(x2, None, params2, dy, None, None, *out[3].saved())
    for kept, saved in zip(list(first[:3]) + list(first[3].saved()), snapshot):
        np.testing.assert_array_equal(np.asarray(kept), saved)
    for kept, saved in zip([grads[0]] + list(grads[3]), grad_snapshot):
        np.testing.assert_array_equal(kept, saved)


def test_reused_buffers_give_the_same_results_as_fresh_ones():
    rng = np.random.default_rng(1)
    x, params = _problem(rng)
    lstmcy.release_workspaces()
    fresh = lstmcy.lstm_forward(x, None, params)[0].copy()
    for _ in range(3):
        again = lstmcy.lstm_forward(x, None, params)[0]
        np.testing.assert_array_equal(again, fresh)


def test_plan_workspaces_start_on_a_cache_line():
    plan = lstmcy.LSTMPlan()
    for name, shape, dtype in [("gates", (3, 5, 7), np.float32), ("h_other", (16, 64), np.float32),
                               ("gates", (2, 9), np.float64), ("z", (1, 3), np.float64)]:
        view = plan._buffers.take(name, shape, np.dtype(dtype))
        assert view.shape == shape and view.dtype == dtype and view.flags.c_contiguous
        assert view.ctypes.data % _results.ALIGN == 0
