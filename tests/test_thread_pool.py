"""lstmcy's thread pool: shared by concurrent callers, safe when oversubscribed, and the
callers' floating-point mode left as it was.

* Several Python threads asking for several kernel threads each, at once, on a 2-core
  machine: every call completes (within a deadline) with the serial bits, and the pool
  never holds more workers than the largest count asked for, less one.
* Subnormal numbers are flushed inside the kernels by default and kept with
  ``set_flush_denormals(False)``; the calling thread's MXCSR (or equivalent) is the same
  after a call, also after a call that raised.
"""
import threading

import numpy as np
import pytest

import lstmcy
from lstmcy import _threadpool
from hostile import Config, make_call, run_with_threads


def test_concurrent_callers_share_the_pool_and_get_the_serial_bits():
    cfg = Config(T=12, B=16, I=20, H=40, L=2, bidirectional=True, dtype=np.dtype(np.float32))
    call = make_call(cfg, np.random.default_rng(3), seed=2)
    expected, _ = run_with_threads(call, 1)
    counts = [2, 3, 4, 6]
    workers_before = _threadpool.pool_size()
    results, errors = {}, []
    barrier = threading.Barrier(len(counts))

    def worker(n):
        try:
            plan = lstmcy.LSTMPlan(n_threads=n)
            barrier.wait()
            for _ in range(5):
                y, h_n, c_n, cache = plan.forward(*call.fwd_args, **call.fwd_kwargs)
                args = list(call.bwd_args)
                args[6:13] = cache.saved()
                grads = plan.backward(*args, **dict(call.bwd_kwargs, dropout_masks=cache.dropout_masks))
            results[n] = [np.array(a) for a in (y, h_n, c_n, grads[0], grads[1], grads[2], *grads[3])]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in counts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors, errors
    for n, got in results.items():
        for k, (a, b) in enumerate(zip(expected, got)):
            assert a.tobytes() == b.tobytes(), f"output {k} on {n} threads"
    # The callers took the idle workers there were: no more than 6 - 1 were ever needed.
    assert _threadpool.pool_size() <= max(workers_before, max(counts) - 1)


def test_many_more_threads_than_cores_complete():
    cfg = Config(T=30, B=33, I=16, H=24, L=1, dtype=np.dtype(np.float64))
    call = make_call(cfg, np.random.default_rng(4), seed=2)
    expected, _ = run_with_threads(call, 1)
    got, _ = run_with_threads(call, 32)
    for k, (a, b) in enumerate(zip(expected, got)):
        assert a.tobytes() == b.tobytes(), f"output {k}"


def cell_with_subnormal_state(flush):
    """c_n of a cell whose gates are all 1/2 and g = 0: c_n = c0 / 2, a subnormal."""
    lstmcy.set_flush_denormals(flush)
    try:
        H = 4
        params = [np.zeros((4 * H, 1), np.float32), np.zeros((4 * H, H), np.float32),
                  np.zeros(4 * H, np.float32), np.zeros(4 * H, np.float32)]
        tiny = np.finfo(np.float32).tiny
        c0 = np.full((1, 2, H), tiny * 0.75, np.float32)  # subnormal
        h0 = np.zeros((1, 2, H), np.float32)
        x = np.zeros((1, 2, 1), np.float32)
        _, _, c_n, _ = lstmcy.lstm_forward(x, (h0, c0), params, train=False)
        return c_n
    finally:
        lstmcy.set_flush_denormals(True)


def test_subnormals_are_flushed_by_default_and_kept_on_request():
    assert lstmcy.get_flush_denormals()
    assert not np.any(cell_with_subnormal_state(True))
    kept = cell_with_subnormal_state(False)
    np.testing.assert_array_equal(kept, np.float32(np.finfo(np.float32).tiny * 0.75) * np.float32(0.5))
    with pytest.raises(TypeError, match="flush must be a bool"):
        lstmcy.set_flush_denormals("no")


@pytest.mark.parametrize("threads", [1, 3])
def test_callers_floating_point_mode_is_restored(threads):
    before = _threadpool.fp_mode()
    cfg = Config(T=5, B=8, I=4, H=16, dtype=np.dtype(np.float32))
    call = make_call(cfg, np.random.default_rng(0), seed=0)
    run_with_threads(call, threads)
    assert _threadpool.fp_mode() == before
    # A call refused by the validation leaves it alone too.
    with pytest.raises(ValueError):
        lstmcy.lstm_forward(call.fwd_args[0][:, :, :2], *call.fwd_args[1:], **call.fwd_kwargs)
    assert _threadpool.fp_mode() == before
    # And so does one that runs with IEEE subnormals.
    lstmcy.set_flush_denormals(False)
    try:
        run_with_threads(call, threads)
    finally:
        lstmcy.set_flush_denormals(True)
    assert _threadpool.fp_mode() == before


needs_hooks = pytest.mark.skipif(not _threadpool.HAS_TEST_HOOKS,
                                 reason="test hooks are in the debug build (LSTMCY_DEBUG=1) only")


def _within(seconds, fn):
    """``fn()``'s result, run in a daemon thread that must finish within ``seconds`` (a
    hang fails the test instead of stalling the suite)."""
    out, errors = [], []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), f"the calls did not finish within {seconds} s"
    if errors:
        raise errors[0]
    return out[0]


def test_parts_beyond_the_cpus_are_spares_and_the_bits_stay(fake_machine):
    # With 1 CPU, a call on 6 threads runs its caller alone at first; the five other parts
    # are spares, handed only while a thread of the job sleeps. The caller alone finishes
    # the job: the call completes (no part is needed) with the serial bits.
    cfg = Config(T=9, B=10, I=5, H=12, L=2, dtype=np.dtype(np.float64), bidirectional=True)
    call = make_call(cfg, np.random.default_rng(8), seed=3)
    expected, _ = run_with_threads(call, 1)
    fake_machine(1)
    for _ in range(3):
        got, _ = _within(120, lambda: run_with_threads(call, 6))
        for k, (a, b) in enumerate(zip(expected, got)):
            assert a.tobytes() == b.tobytes(), f"output {k}"


@needs_hooks
def test_a_thread_about_to_sleep_hands_a_spare(monkeypatch, fake_machine):
    # Waits that sleep at once (LSTMCY_TEST_WAIT_SPIN_NS=0) on 2 CPUs and 8 threads: the
    # job's two running threads wait for each other's projection pieces, recurrence steps
    # and gradients, and each wait that sleeps hands a spare part to a worker. The forward
    # takes the BLAS projection (fused_input off), whose pieces the recurrences wait for.
    # A call waits only where one thread gets ahead of the other, which about one call in
    # five does here: calls repeat until one has handed a spare (at most CALLS). Bits as on
    # one thread.
    from lstmcy._engine import plan as _core
    from lstmcy._engine import schedule as _schedule
    policy = _schedule.SchedulePolicy(forward=lambda *a, **k: _schedule.forward_schedule(
        *a, **k)._replace(fused_input=False))

    def without_fused_input(threads):
        # On the calling thread's plan: each call of _within runs in a thread of its own.
        previous = _core.use_thread_plan(lstmcy.LSTMPlan(schedules=policy))
        try:
            return run_with_threads(call, threads)
        finally:
            _core.use_thread_plan(previous)

    cfg = Config(T=12, B=16, I=6, H=20, L=2, dtype=np.dtype(np.float64), bidirectional=True)
    call = make_call(cfg, np.random.default_rng(9), seed=4)
    expected, _ = without_fused_input(1)
    fake_machine(2)
    monkeypatch.setenv("LSTMCY_TEST_WAIT_SPIN_NS", "0")
    before = _threadpool.spares_handed()
    CALLS = 60
    for _ in range(CALLS):
        got, _ = _within(120, lambda: without_fused_input(8))
        for k, (a, b) in enumerate(zip(expected, got)):
            assert a.tobytes() == b.tobytes(), f"output {k}"
        if _threadpool.spares_handed() > before:
            break
    assert _threadpool.spares_handed() > before, f"no spare handed in {CALLS} calls"


@needs_hooks
def test_a_call_does_not_wait_for_a_worker_that_has_not_started(monkeypatch, fake_machine):
    # Every job's part 2 goes to a worker that sleeps 2 s before taking it (as a worker
    # waiting for a core behind other threads would): the caller and part 1 do all the
    # work, the caller withdraws part 2, and the call returns with the serial bits.
    import time

    cfg = Config(T=10, B=12, I=8, H=24, L=2, dtype=np.dtype(np.float64))
    call = make_call(cfg, np.random.default_rng(5), seed=2)
    expected, _ = run_with_threads(call, 1)
    fake_machine(3)  # part 2 is handed at the start, not kept as a spare
    run_with_threads(call, 3)  # the workers exist
    before = _threadpool.withdrawn_parts()
    monkeypatch.setenv("LSTMCY_TEST_WAKE_DELAY_US", "2:2000000")
    start = time.perf_counter()
    got, _ = run_with_threads(call, 3)
    elapsed = time.perf_counter() - start
    monkeypatch.delenv("LSTMCY_TEST_WAKE_DELAY_US")
    for k, (a, b) in enumerate(zip(expected, got)):
        assert a.tobytes() == b.tobytes(), f"output {k}"
    assert _threadpool.withdrawn_parts() > before
    assert elapsed < 2.0, "the call waited for the sleeping worker"
    # The late worker wakes to a withdrawn part (or a later job's): later calls are whole.
    time.sleep(2.2)
    for _ in range(3):
        got, _ = run_with_threads(call, 3)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(expected, got))
