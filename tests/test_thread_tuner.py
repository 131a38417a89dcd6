"""The automatic choice between one thread and the automatic count n
(``lstmcy._engine.threads.ThreadTuner``).

The tuner only changes speed: results are bitwise the same for any thread count (that is
checked in test_determinism.py, test_schedule.py and test_threaded_paths.py, and here once
more through the plan with the tuner forced each way). These tests drive it with made-up
times on a made-up clock and check what it picks (n = 2 unless said otherwise).
"""
import numpy as np
import pytest

import lstmcy
from lstmcy._engine.threads import ThreadChoice, ThreadTuner


def feed(tuner, now, seconds_for, calls, step=0.001):
    """Run ``calls`` calls through ``tuner``; ``seconds_for(n)`` is a call's time on n
    threads. Returns the counts chosen and the clock after the last call."""
    chosen = []
    for _ in range(calls):
        n = tuner.choose(now)
        chosen.append(n)
        tuner.record(n, now, seconds_for(n))
        now += step
    return chosen, now


def test_measures_both_counts_first_then_runs_the_faster():
    tuner = ThreadTuner()
    chosen, _ = feed(tuner, 0.0, lambda n: 1.0 if n == 1 else 0.6, 50)
    # Each count's first call warms up and is not counted.
    assert chosen[:4] == [2, 2, 1, 1]
    assert set(chosen[4:]) == {2}


def test_first_call_on_each_count_is_not_counted():
    tuner = ThreadTuner()
    times = iter([50.0, 0.6, 1.0, 1.0])  # two threads' first call page-faulted
    chosen, _ = feed(tuner, 0.0, lambda n: next(times), 4)
    assert tuner.mean == [1.0, 0.6]
    assert tuner.choose(0.004) == 2


def test_one_thread_is_tried_again_only_every_retry_one_seconds():
    tuner = ThreadTuner()
    # 1 ms per call for 2 s: after the first measurement, one thread comes back about
    # every RETRY_ONE seconds and never more often.
    chosen, _ = feed(tuner, 0.0, lambda n: 1.0 if n == 1 else 0.6, 2000)
    tries = [k for k, n in enumerate(chosen) if n == 1][1:]  # the first was a warm-up
    assert len(tries) in (int(2.0 / ThreadTuner.RETRY_ONE), 1 + int(2.0 / ThreadTuner.RETRY_ONE))
    gaps = np.diff(tries) * 0.001
    assert gaps.min() >= ThreadTuner.RETRY_ONE


def test_falls_back_to_one_thread_when_two_get_slow_and_returns_when_they_recover():
    tuner = ThreadTuner()
    fast = lambda n: 1.0 if n == 1 else 0.6  # noqa: E731
    slow = lambda n: 1.0 if n == 1 else 1.8  # noqa: E731  (two threads sharing a core)
    _, now = feed(tuner, 0.0, fast, 20)
    chosen, now = feed(tuner, now, slow, 200)
    # A few calls to notice, then mostly one thread, with two tried every RETRY_TWO.
    assert chosen[:3] == [2, 2, 2]
    late = chosen[20:]
    assert late.count(1) > 0.9 * len(late)
    assert late.count(2) >= int(len(late) * 0.001 / ThreadTuner.RETRY_TWO) - 1
    chosen, now = feed(tuner, now, fast, 1000)
    # Back to two threads within a few tries: the lost ones have spaced the tries out (at
    # most MAX_BACKOFF times), a fast one brings back the usual pace.
    back = next(k for k in range(len(chosen)) if set(chosen[k:k + 200]) == {2})
    assert back * 0.001 <= (ThreadTuner.MAX_BACKOFF + 3) * ThreadTuner.RETRY_TWO + 0.005


def test_tries_of_two_threads_get_rarer_under_lasting_load_and_reset_when_they_win():
    tuner = ThreadTuner()
    _, now = feed(tuner, 0.0, lambda n: 1.0 if n == 1 else 0.6, 20)
    # Ten seconds of 1 ms calls with two threads 1.8x slower than one.
    chosen, now = feed(tuner, now, lambda n: 1.0 if n == 1 else 1.8, 10000)
    tries = [k for k, n in enumerate(chosen) if n == 2][3:]  # after the switch to one
    gaps = np.diff(tries) * 0.001
    # Each gap at least the last (doubling from RETRY_TWO), none above the cap.
    assert np.all(np.diff(gaps) >= -0.002)
    assert gaps.max() <= ThreadTuner.MAX_BACKOFF * ThreadTuner.RETRY_TWO + 0.002
    # Without the doubling there would be 10 / RETRY_TWO = 200 tries.
    assert len(tries) <= 4 + 10.0 / (ThreadTuner.MAX_BACKOFF * ThreadTuner.RETRY_TWO) + 2
    assert tuner.backoff == ThreadTuner.MAX_BACKOFF
    # Two threads win again: the next try switches back and the wait starts over.
    chosen, now = feed(tuner, now, lambda n: 1.0 if n == 1 else 0.6, 2000)
    assert tuner.backoff == 1 and chosen[-1] == 2


def test_one_slow_call_does_not_switch_and_small_differences_keep_two_threads():
    tuner = ThreadTuner()
    _, now = feed(tuner, 0.0, lambda n: 1.0 if n == 1 else 0.6, 10)
    # A preempted call, 50x slower: counted as at most OUTLIER times the average.
    tuner.record(2, now, 30.0)
    assert tuner.mean[1] <= 0.6 + ThreadTuner.SMOOTHING * (ThreadTuner.OUTLIER - 1) * 0.6 + 1e-12
    assert tuner.choose(now + 0.001) == 2
    # Two threads 10 % slower than one: within the margin, they stay.
    tuner = ThreadTuner()
    chosen, _ = feed(tuner, 0.0, lambda n: 1.0 if n == 1 else 1.1, 100)
    assert set(chosen[4:]) == {2}
    # 30 % slower: one thread.
    tuner = ThreadTuner()
    chosen, _ = feed(tuner, 0.0, lambda n: 1.0 if n == 1 else 1.3, 100)
    assert chosen[4:].count(1) > 90


def test_tuner_chooses_between_one_and_its_count():
    tuner = ThreadTuner(8)
    chosen, _ = feed(tuner, 0.0, lambda n: 1.0 if n == 1 else 0.3, 50)
    assert chosen[:4] == [8, 8, 1, 1] and set(chosen[4:]) == {8}


def recorder(calls):
    def run(n_threads):
        calls.append(n_threads)
    return run


class FixedTuner:
    """A tuner that always chooses ``choice`` threads."""

    def __init__(self, choice):
        self.choice = choice
        self.records = []

    def choose(self, now):
        return self.choice

    def record(self, n_threads, now, elapsed):
        self.records.append(n_threads)


def test_plan_call_uses_the_tuner_only_when_automatic(fake_machine):
    fake_machine(4)
    calls = []
    choice = ThreadChoice(None, new_tuner=lambda n: FixedTuner(1))
    choice.run(("k",), 10, 1e6, 1e8, recorder(calls))
    tuners = choice.tuners
    assert calls == [1] and ("k", 4) in tuners and tuners["k", 4].records == [1]
    # A call the work rule gives one thread is never moved to more.
    choice.run(("k1",), 10, 1e6, 1e5, recorder(calls))
    assert calls[-1] == 1 and not any(key[0] == "k1" for key in choice.tuners)
    # An explicit count, per plan or global, is obeyed, more threads than CPUs included.
    plan2 = lstmcy.LSTMPlan(n_threads=7)
    plan2._thread_choice.run(("k",), 10, 1e6, 1e8, recorder(calls))
    assert calls[-1] == 7 and not plan2._thread_choice.tuners
    # A call with much work per step keeps its threads.
    choice.run(("big",), 10, 1e9, 1e10, recorder(calls))
    assert calls[-1] == 4 and not any(key[0] == "big" for key in choice.tuners)
    lstmcy.set_num_threads(3)  # the fake machine's global setting
    plan3 = lstmcy.LSTMPlan()
    plan3._thread_choice.run(("k",), 10, 1e6, 1e8, recorder(calls))
    assert calls[-1] == 3 and not plan3._thread_choice.tuners


def test_the_plan_tunes_with_thread_tuners(fake_machine):
    fake_machine(4)
    plan = lstmcy.LSTMPlan()
    plan._thread_choice.run(("k",), 10, 1e6, 1e8, lambda n: None)
    assert type(plan._thread_choice.tuners["k", 4]) is ThreadTuner


def test_plan_keeps_a_bounded_number_of_tuners(fake_machine):
    fake_machine(2)
    plan = lstmcy.LSTMPlan()
    for k in range(200):
        plan._thread_choice.run(("shape", k), 10, 1e6, 1e8, lambda n: None)
    assert 0 < len(plan._thread_choice.tuners) <= 64


@pytest.mark.parametrize("choice", [1, 2])
def test_results_do_not_depend_on_the_tuners_choice(fake_machine, choice):
    """The same bits whichever count the tuner picks, for a shape that uses the split
    forward and the two-thread backward."""
    fake_machine(2)
    rng = np.random.default_rng(5)
    T, B, I, H = 12, 16, 24, 48
    x = rng.standard_normal((T, B, I)).astype(np.float32)
    params = [rng.uniform(-0.2, 0.2, s).astype(np.float32)
              for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,)]]
    dy = rng.standard_normal((T, B, H)).astype(np.float32)

    def run(n_threads_fixed=None, tuner_choice=None):
        plan = lstmcy.LSTMPlan(n_threads=n_threads_fixed)
        if tuner_choice is not None:
            # The plan's choice of threads is one of its parts: one whose tuners always
            # choose tuner_choice.
            plan._thread_choice = ThreadChoice(None, lambda n: FixedTuner(tuner_choice))
        y, h_n, c_n, cache = plan.forward(x, None, params)
        grads = plan.backward(x, None, params, dy, None, None, *cache.saved())
        if n_threads_fixed is None:
            tuners = plan._thread_choice.tuners.values()
            assert tuners and all(tuner.records for tuner in tuners), \
                "the tuner was not consulted"
        return [y, h_n, c_n, *[a for arrays in cache.saved() for a in arrays], grads[0],
                *grads[3]]

    expected = run(n_threads_fixed=1)
    got = run(tuner_choice=choice)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("two_faster", [True, False])
def test_calls_far_apart_still_run_the_faster_count(two_faster):
    """Calls spaced further apart than the retry intervals (a long sequence, or a caller
    that does other work in between) must not try the other count on every call."""
    tuner = ThreadTuner()
    seconds_for = (lambda n: 1.0 if n == 1 else 0.6) if two_faster else \
        (lambda n: 1.0 if n == 1 else 1.8)
    chosen, _ = feed(tuner, 0.0, seconds_for, 200, step=1.0)  # a call every second
    faster = 2 if two_faster else 1
    every = ThreadTuner.RETRY_ONE_CALLS if two_faster else ThreadTuner.RETRY_TWO_CALLS
    late = chosen[10:]
    assert late.count(faster) >= len(late) * every / (every + 1) - 1
    if not two_faster:  # tries of two threads that lose space the next ones out
        every *= ThreadTuner.MAX_BACKOFF
    assert late.count(3 - faster) >= len(late) // (every + 1) - 1  # still tried now and then
