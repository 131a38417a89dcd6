"""The automatic thread count: the CPUs this process may really use.

Affinity, the cgroup CPU quota (v1 and v2, faked as file trees), OMP_NUM_THREADS and
threadpoolctl's limit each cap it; an explicit count is obeyed as given; the work rule
gives small calls fewer threads. One test sets a real affinity in a child process.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import threadpoolctl

import lstmcy
from lstmcy import _threadpool
from lstmcy._engine import plan as _core
from lstmcy._engine import schedule as _schedule
from lstmcy._engine import threads as _threads


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_cgroup_v2(root, cpu_max, nested=None):
    """A cgroup v2 tree: the process in /docker/app, ``cpu_max`` at /docker/app (and
    ``nested`` at its parent /docker, if given)."""
    write(root / "proc/self/cgroup", "0::/docker/app\n")
    write(root / "proc/self/mountinfo",
          "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    write(root / "sys/fs/cgroup/docker/app/cpu.max", cpu_max)
    if nested is not None:
        write(root / "sys/fs/cgroup/docker/cpu.max", nested)


def fake_cgroup_v1(root, quota, period, path="/kubepods/pod1"):
    write(root / "proc/self/cgroup",
          f"12:memory:{path}\n4:cpu,cpuacct:{path}\n1:name=systemd:{path}\n0::/\n")
    write(root / "proc/self/mountinfo",
          "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
          "31 25 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n")
    write(root / f"sys/fs/cgroup/cpu,cpuacct{path}/cpu.cfs_quota_us", f"{quota}\n")
    write(root / f"sys/fs/cgroup/cpu,cpuacct{path}/cpu.cfs_period_us", f"{period}\n")


@pytest.mark.parametrize("cpu_max, nested, expected", [
    ("200000 100000\n", None, 2),
    ("150000 100000\n", None, 2),   # 1.5 CPUs: rounded up
    ("50000 100000\n", None, 1),
    ("max 100000\n", None, None),
    ("max 100000\n", "300000 100000\n", 3),  # the parent's quota holds the child
    ("800000 100000\n", "400000 100000\n", 4),
    ("garbage\n", None, None),
])
def test_cgroup_v2_quota(tmp_path, cpu_max, nested, expected):
    fake_cgroup_v2(tmp_path, cpu_max, nested)
    assert _threads.cgroup_cpu_limit(str(tmp_path)) == expected


@pytest.mark.parametrize("quota, period, expected", [
    (200000, 100000, 2), (-1, 100000, None), (250000, 100000, 3), (100000, 0, None)])
def test_cgroup_v1_quota(tmp_path, quota, period, expected):
    fake_cgroup_v1(tmp_path, quota, period)
    assert _threads.cgroup_cpu_limit(str(tmp_path)) == expected


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert _threads.cgroup_cpu_limit(str(tmp_path)) is None


def test_this_machines_cgroups_are_read_without_error():
    limit = _threads.cgroup_cpu_limit()
    assert limit is None or limit >= 1


@pytest.fixture
def machine(fake_machine, monkeypatch, tmp_path):
    """``machine(cpus, quota=None)``: a process with the affinity of ``cpus`` CPUs and a
    cgroup v2 quota of ``quota`` CPUs (a fake file tree), reading this environment."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def fake(cpus, quota=None):
        root = tmp_path / f"machine-{cpus}-{quota}"
        if quota is not None:
            fake_cgroup_v2(root, f"{quota * 100000} 100000\n")
        fake_machine(cpus, cgroup_root=str(root), environ=os.environ)
    return fake


def test_affinity_and_quota_cap_the_count(machine, monkeypatch):
    machine(64)
    assert _threads.available_cpus() == 64
    machine(64, quota=2)  # a container limited to 2 CPUs on a 64-core host
    assert _threads.available_cpus() == 2
    machine(3, quota=8)
    assert _threads.available_cpus() == 3


def test_omp_num_threads_caps_the_count(machine, monkeypatch):
    machine(16)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert _threads.available_cpus() == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "6,2")  # nested levels: the first counts
    assert _threads.available_cpus() == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "32")  # more than the CPUs: no effect
    assert _threads.available_cpus() == 16
    monkeypatch.setenv("OMP_NUM_THREADS", "nonsense")
    assert _threads.available_cpus() == 16


@pytest.mark.parametrize("user_api", [None, "openmp"])
def test_threadpoolctl_limit_caps_the_count(machine, user_api):
    machine(16)
    info = [lib for lib in threadpoolctl.threadpool_info() if lib["internal_api"] == "lstmcy"]
    assert len(info) == 1 and info[0]["user_api"] == "openmp" and info[0]["num_threads"] == 16
    with threadpoolctl.threadpool_limits(limits=3, user_api=user_api):
        assert _threads.available_cpus() == 3
        assert _threads.threads_for(1e12) == 3
    assert _threads.available_cpus() == 16
    assert _threadpool.thread_limit() == 0  # restored: no limit left behind


def test_work_rule_gives_small_calls_fewer_threads(machine):
    machine(32)
    per = _schedule.FLOPS_PER_THREAD
    assert _threads.threads_for(0.5 * per) == 1
    assert _threads.threads_for(5.5 * per) == 5
    assert _threads.threads_for(1e6 * per) == 32


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 17])
def test_explicit_counts_are_obeyed(machine, monkeypatch, n):
    """set_num_threads(n) and LSTMPlan(n_threads=n) run the kernels on n threads, more
    than the CPUs included, whatever the work rule says."""
    machine(2)
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 2))  # tiny: the work rule alone would give one thread
    params = [rng.standard_normal(s) for s in [(8, 2), (8, 2), (8,), (8,)]]
    plan = lstmcy.LSTMPlan(n_threads=n)
    y, h_n, c_n, cache = plan.forward(x, None, params)
    seen = [(call.n_threads, call.n_workers) for call in _layer_calls(plan, "ForwardLayer")]
    plan.backward(x, None, params, np.ones_like(y), None, None, *cache.saved())
    seen += [(call.n_threads, call.n_workers) for call in _layer_calls(plan, "BackwardLayer")]
    thread_plan = lstmcy.LSTMPlan()
    previous = _core.use_thread_plan(thread_plan)
    lstmcy.set_num_threads(n)
    try:
        lstmcy.lstm_forward(x, None, params)
    finally:
        lstmcy.set_num_threads(None)
        _core.use_thread_plan(previous)
    seen += [(call.n_threads, call.n_workers) for call in _layer_calls(thread_plan)]
    assert seen == [(n, n)] * 3


def test_bad_counts_are_refused():
    for bad, error in ((0, ValueError), (-1, ValueError), (np.int64(0), ValueError),
                       (2.5, TypeError), (2.0, TypeError), (True, TypeError), ("4", TypeError)):
        with pytest.raises(error, match="n_threads must be a positive int or None"):
            lstmcy.set_num_threads(bad)
        with pytest.raises(error, match="n_threads must be a positive int or None"):
            lstmcy.LSTMPlan(n_threads=bad)


def test_numpy_integer_counts_are_ints():
    plan = lstmcy.LSTMPlan(n_threads=np.int64(3))
    assert plan.n_threads == 3 and type(plan.n_threads) is int
    lstmcy.set_num_threads(np.int32(2))
    try:
        assert lstmcy.get_num_threads() == 2 and type(lstmcy.get_num_threads()) is int
    finally:
        lstmcy.set_num_threads(None)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_real_affinity_in_a_child_process():
    script = textwrap.dedent("""
        import os
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        from lstmcy._engine import threads as _threads
        print(_threads.available_cpus(), _threads.threads_for(1e12))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs and sched_setaffinity")
def test_an_explicit_count_tells_the_pool_the_cpus():
    # A process that only ever asks for explicit counts must still tell the pool its CPUs:
    # the pool takes one CPU until told, and would run every job on its calling thread
    # alone (the other parts spares, started only while it sleeps).
    script = textwrap.dedent("""
        import os
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
        import numpy as np
        import lstmcy
        from lstmcy import _threadpool
        x = np.zeros((3, 2, 2))
        params = [np.zeros(s) for s in [(8, 2), (8, 2), (8,), (8,)]]
        before = _threadpool.cpu_count()
        lstmcy.LSTMPlan(n_threads=2).forward(x, None, params)
        print(before, _threadpool.cpu_count())
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2"]


def test_the_recurrence_is_split_for_at_most_the_cpus(machine):
    # 8 threads on 2 CPUs run 8 threads, but the recurrence in 2 row groups: thinner groups
    # could not run at once and would only add work.
    import numpy as np
    machine(2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64, 8)).astype(np.float32)
    params = [rng.standard_normal(s).astype(np.float32) for s in [(64, 8), (64, 16), (64,), (64,)]]
    plan = lstmcy.LSTMPlan(n_threads=8)
    y, h_n, c_n, cache = plan.forward(x, None, params)
    seen = [(type(call).__name__, call.schedule.groups, call.n_threads, call.n_workers)
            for call in _layer_calls(plan, "ForwardLayer")]
    plan.backward(x, None, params, np.ones_like(y), None, None, *cache.saved())
    seen += [(type(call).__name__, call.schedule.groups, call.n_threads, call.n_workers)
             for call in _layer_calls(plan, "BackwardLayer")]
    assert _schedule.forward_schedule(4, 64, 8, 16, 1, 8).groups > 2  # what 8 CPUs would get
    assert seen == [("ForwardLayer", 2, 8, 8), ("BackwardLayer", 2, 8, 8)]


def _layer_calls(plan, kind=None):
    """The kernel objects ``plan`` keeps (of type ``kind``: all if None)."""
    return [call for setup in plan._setups.values() for call in setup.by_threads.values()
            if kind is None or type(call).__name__ == kind]
