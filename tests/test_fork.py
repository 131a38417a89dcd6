"""Fork safety: after a multi-threaded call, a forked child's calls complete and give the
parent's bits.

A child process has only the thread that called fork; lstmcy's pool forgets the parent's
workers in the child (a pthread_atfork handler) and starts its own, and lstmcy's Python
state (the BLAS cap's lock) is reset. Every scenario runs in a fresh interpreter with a
deadline, so that a hang fails the test instead of stalling the suite: os.fork after a
threaded call; a multiprocessing pool with the fork start method; fork from one thread
while another is inside a kernel; joblib's multiprocessing backend.
"""
import os
import subprocess
import sys
import textwrap

import pytest

DEADLINE = 120  # seconds for a whole scenario (each runs in well under 10 s here)

# A problem big enough for several threads, its results in the parent, and a comparison.
COMMON = textwrap.dedent("""
    import os, sys, time, threading, warnings
    warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
    import numpy as np
    import lstmcy
    from lstmcy import _threadpool

    rng = np.random.default_rng(0)
    T, B, I, H = 30, 16, 24, 48
    X = rng.standard_normal((T, B, I))
    PARAMS = [rng.uniform(-0.3, 0.3, s) for s in [(4 * H, I), (4 * H, H), (4 * H,), (4 * H,),
                                                  (4 * H, H), (4 * H, H), (4 * H,), (4 * H,)]]
    DY = rng.standard_normal((T, B, H))

    def run(seed=0):
        y, h_n, c_n, cache = lstmcy.lstm_forward(X + seed, None, PARAMS, num_layers=2)
        dx, dh, dc, dparams = lstmcy.lstm_backward(X + seed, None, PARAMS, DY, None, None,
                                                   *cache.saved(), num_layers=2)
        return [np.ascontiguousarray(a) for a in (y, h_n, c_n, dx, dh, dc, *dparams)]

    def same(a, b):
        return len(a) == len(b) and all(p.tobytes() == q.tobytes() for p, q in zip(a, b))

    def wait_child(pid, seconds=60):
        deadline = time.monotonic() + seconds
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return "hung"
            time.sleep(0.02)

    lstmcy.set_num_threads(3)
    EXPECTED = run()
    assert _threadpool.pool_size() == 2, _threadpool.pool_size()
""")


def run_scenario(body):
    script = COMMON + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=DEADLINE, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the scenario hung (no end within {DEADLINE} s): {exc.stdout} {exc.stderr}")
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "ok" in result.stdout, result.stdout


def test_os_fork_after_a_threaded_call():
    run_scenario("""
        pid = os.fork()
        if pid == 0:
            try:
                forks = _threadpool.fork_count()
                got = run()
                code = 0 if same(got, EXPECTED) and forks == 1 else 3
                # the child started workers of its own
                code = code or (0 if _threadpool.pool_size() == 2 else 4)
            except BaseException as exc:
                print(exc, file=sys.stderr)
                code = 5
            os._exit(code)
        status = wait_child(pid)
        assert status == 0, f"child: {status}"
        assert same(run(), EXPECTED)  # the parent's pool still works
        print("ok")
    """)


def test_multiprocessing_fork_pool():
    run_scenario("""
        import multiprocessing as mp

        def work(seed):
            return run(seed)

        expected = [run(seed) for seed in range(4)]
        with mp.get_context("fork").Pool(2) as pool:
            results = pool.map_async(work, range(4)).get(timeout=60)
        assert all(same(a, b) for a, b in zip(results, expected))
        print("ok")
    """)


def test_fork_while_another_thread_is_inside_a_kernel():
    run_scenario("""
        # Under a sanitizer (5-15x slower) fewer steps keep one call within the deadline.
        steps = 40 if os.environ.get("LSTMCY_BUILD_KIND") in ("asan", "tsan") else 400
        big_x = rng.standard_normal((steps, 64, 128))
        big_params = [rng.uniform(-0.1, 0.1, s) for s in [(1024, 128), (1024, 256), (1024,), (1024,)]]
        inside = threading.Event()
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                inside.set()
                lstmcy.lstm_forward(big_x, None, big_params)  # ~0.1-1 s on 3 threads

        thread = threading.Thread(target=busy)
        thread.start()
        inside.wait()
        time.sleep(0.05)  # well inside a kernel call by now
        pid = os.fork()
        if pid == 0:
            try:
                code = 0 if same(run(), EXPECTED) else 3
            except BaseException as exc:
                print(exc, file=sys.stderr)
                code = 5
            os._exit(code)
        status = wait_child(pid)
        stop.set()
        thread.join(60)
        assert not thread.is_alive()
        assert status == 0, f"child: {status}"
        print("ok")
    """)


def test_joblib_multiprocessing_backend():
    pytest.importorskip("joblib")
    run_scenario("""
        from joblib import Parallel, delayed

        expected = [run(seed) for seed in range(4)]
        results = Parallel(n_jobs=2, backend="multiprocessing", timeout=60)(
            delayed(run)(seed) for seed in range(4))
        assert all(same(a, b) for a, b in zip(results, expected))
        print("ok")
    """)
