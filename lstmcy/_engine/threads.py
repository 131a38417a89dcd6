"""Thread settings: how many threads the kernels use, and keeping BLAS single-threaded.

The kernels run on lstmcy's own thread pool (:mod:`lstmcy._threadpool`, no OpenMP) and
call BLAS from every thread, so BLAS must run single-threaded meanwhile, or the two would
oversubscribe the cores: :func:`blas_single_threaded` caps the BLAS library that
``scipy.linalg.cython_blas`` uses (found once with threadpoolctl) for the duration of a
kernel call and restores it afterwards; concurrent callers share one cap.

The automatic thread count of a call is the smallest of

* the CPUs this process may run on (``os.sched_getaffinity``),
* its cgroup's CPU quota, rounded up (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``, the lowest along the cgroup's ancestors): a container limited to
  2 CPUs on a 64-core host gets 2,
* ``OMP_NUM_THREADS`` (its first number), as OpenMP libraries read it,
* the limit set through threadpoolctl (``threadpool_limits(n)``, or with
  ``user_api="openmp"``: lstmcy registers a controller, internal_api ``"lstmcy"``),

and of the work rule :func:`lstmcy._engine.schedule.threads_for_work`; a :class:`ThreadTuner` then
moves small calls to one thread while more threads are slower. ``set_num_threads(n)``
and ``LSTMPlan(n_threads=n)`` fix the count instead (any n >= 1, obeyed as given).
Results are bitwise identical for every count. These facts of the machine and the global
setting are held by one :class:`MachineView`, which :func:`machine_view` replaces for a
block (tests present machines of any size through it).

After ``fork()`` the child starts its own workers (the pool's fork handler) and this
module's state is reset (:func:`_after_fork_in_child`), so a child's calls complete.
"""
import contextlib
import ctypes
import functools
import math
import os
import threading
from numbers import Integral
from time import perf_counter

import threadpoolctl

from lstmcy import _threadpool
from lstmcy._engine.schedule import FLOPS_PER_THREAD, TUNED_STEP_FLOPS, threads_for_work

_lock = threading.Lock()
_active = 0
_saved = []
_controllers = None
#: The pool runs at most this many threads in one call.
MAX_THREADS = 256


def affinity_cpus():
    """Number of CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _cgroup_dirs(root):
    """The cgroup directories holding this process's CPU limits, innermost first, with
    the cgroup version of each (from /proc/self/cgroup and /proc/self/mountinfo; ``root``
    prefixes every path, for tests)."""
    cgroups = _read(os.path.join(root, "proc/self/cgroup")) or ""
    mounts = _read(os.path.join(root, "proc/self/mountinfo")) or ""
    found = []
    for line in mounts.splitlines():
        # id parent major:minor root mount-point options ... - fstype source super-options
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 3 or len(fields) < 5:
            continue
        fstype, super_options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        mount_root, mount_point = fields[3], fields[4]
        if fstype == "cgroup2":
            version, wanted = 2, ""
        elif fstype == "cgroup" and "cpu" in super_options.split(","):
            version, wanted = 1, "cpu"
        else:
            continue
        for entry in cgroups.splitlines():
            parts = entry.split(":", 2)
            if len(parts) != 3:
                continue
            controllers = parts[1].split(",") if parts[1] else [""]
            if (version == 2 and parts[0] == "0" and parts[1] == "") or (
                    version == 1 and wanted in controllers):
                path = parts[2]
                relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else "."
                directory = os.path.normpath(os.path.join(mount_point, relative))
                top = os.path.normpath(mount_point)
                while True:  # the cgroup and its ancestors up to the mount point
                    found.append((version, os.path.join(root, directory.lstrip("/"))))
                    if directory == top or len(directory) <= len(top):
                        break
                    directory = os.path.dirname(directory)
    return found


def cgroup_cpu_limit(root="/"):
    """The CPU quota of this process's cgroups as a number of CPUs (rounded up), or None
    when there is none."""
    limits = []
    for version, directory in _cgroup_dirs(root):
        if version == 2:
            text = _read(os.path.join(directory, "cpu.max"))
            fields = text.split() if text else []
            if len(fields) == 2 and fields[0] != "max":
                quota, period = fields
            else:
                continue
        else:
            quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))
            period = _read(os.path.join(directory, "cpu.cfs_period_us"))
            if quota is None or period is None:
                continue
        try:
            quota, period = int(quota), int(period)
        except ValueError:
            continue
        if quota > 0 and period > 0:
            limits.append(max(1, math.ceil(quota / period)))
    return min(limits) if limits else None


def omp_num_threads(environ=os.environ):
    """The first number of ``OMP_NUM_THREADS``, or None when unset or not a positive int."""
    raw = environ.get("OMP_NUM_THREADS")
    return None if raw is None else _parse_omp_num_threads(raw)


@functools.lru_cache(maxsize=64)
def _parse_omp_num_threads(raw):
    # Read on every automatic call: parsed once per value.
    try:
        n = int(raw.split(",")[0].strip())
    except ValueError:
        return None
    return n if n > 0 else None


def _process_cpus():
    """CPUs the process may use by affinity and quota, as the installed :class:`MachineView`
    sees them (read once per view; the first read tells the pool)."""
    machine = _machine
    cpus = machine.cpus
    if cpus is None:
        cpus = machine.cpus = machine.read_cpus()
        _threadpool.set_cpu_count(cpus)
    return cpus


def available_cpus():
    """The CPUs automatic thread counts may use: affinity, quota, OMP_NUM_THREADS and the
    threadpoolctl limit, the smallest of them (at least 1)."""
    cpus = _process_cpus()
    omp = omp_num_threads(_machine.environ)
    if omp is not None and omp < cpus:
        cpus = omp
    limit = _threadpool.thread_limit()
    if 0 < limit < cpus:
        cpus = limit
    return max(1, min(cpus, MAX_THREADS))


def set_num_threads(n_threads):
    """Set the number of threads lstmcy's kernels use: a positive int, or None for automatic.

    Automatic uses the CPUs this process may really use (its affinity, its cgroup's CPU
    quota, ``OMP_NUM_THREADS``, a threadpoolctl limit) as far as a call has work for them,
    and on small calls times them and uses one thread while more are slower
    (:class:`ThreadTuner`). A number is obeyed as given: a call runs on up to that many
    threads, and beyond the CPUs the process may use, the extra ones are spares that work
    while others wait (about as many threads as CPUs running at once).
    Results are bitwise identical either way.
    """
    _machine.num_threads = _check_count("n_threads", n_threads)


def _check_count(name, n_threads):
    """``n_threads`` as an int >= 1 or None (numpy integers accepted; TypeError for other
    types, ValueError below 1)."""
    if n_threads is None or (type(n_threads) is int and n_threads >= 1):
        return n_threads
    if isinstance(n_threads, bool) or not isinstance(n_threads, Integral):
        raise TypeError(f"{name} must be a positive int or None, got {n_threads!r}")
    if n_threads < 1:
        raise ValueError(f"{name} must be a positive int or None, got {n_threads!r}")
    return int(n_threads)


def get_num_threads():
    """The thread setting: an int, or None for automatic."""
    return _machine.num_threads


class MachineView:
    """The machine as lstmcy's thread counts see it: the CPUs the process may use (its
    affinity and its cgroup's CPU quota, read once), the environment ``OMP_NUM_THREADS``
    comes from, and the global thread setting (:func:`set_num_threads`).

    The process has one, read from the system; :func:`machine_view` installs another for
    a block, which is how tests present a machine of any size.

    Parameters
    ----------
    affinity : int or None, default None
        CPUs the process may run on; None reads them (:func:`affinity_cpus`).
    cgroup_root : str or None, default "/"
        Root of the ``/proc`` and ``/sys`` files the cgroup CPU quota is read from
        (:func:`cgroup_cpu_limit`); None: no quota.
    environ : mapping, default os.environ
        Where ``OMP_NUM_THREADS`` is read, at every automatic call.
    num_threads : int or None, default None
        The global thread setting (None: automatic).
    """

    __slots__ = ("affinity", "cgroup_root", "environ", "num_threads", "cpus")

    def __init__(self, affinity=None, cgroup_root="/", environ=os.environ, num_threads=None):
        self.affinity = affinity
        self.cgroup_root = cgroup_root
        self.environ = environ
        self.num_threads = _check_count("num_threads", num_threads)
        self.cpus = None  # by affinity and quota: read on first use (_process_cpus)

    def read_cpus(self):
        """CPUs the process may use by affinity and quota, read now."""
        quota = None if self.cgroup_root is None else cgroup_cpu_limit(self.cgroup_root)
        cpus = affinity_cpus() if self.affinity is None else self.affinity
        return min(cpus, quota) if quota else cpus


_machine = MachineView()  # the installed view: every thread count reads it


@contextlib.contextmanager
def machine_view(view):
    """Make lstmcy see the machine ``view`` describes inside the block: automatic thread
    counts, the thread pool's count of CPUs and :func:`set_num_threads` use it; the
    previous view is back afterwards.

    For tests and experiments (a process has one machine): not for use while another
    thread runs lstmcy.

    Parameters
    ----------
    view : MachineView

    Yields
    ------
    MachineView
        ``view``.
    """
    global _machine
    previous = _machine
    _machine = view
    try:
        _process_cpus()  # the pool sees the view's CPUs
        yield view
    finally:
        _machine = previous
        _threadpool.set_cpu_count(_process_cpus())


def threads_for(flops, n_threads=None):
    """Threads for a call of ``flops`` work: the plan's or global setting, else automatic."""
    setting = _machine.num_threads if n_threads is None else n_threads
    if setting is not None:
        if setting > 1:
            _process_cpus()  # the pool's waits spin only while its threads fit the CPUs
        return min(setting, MAX_THREADS)
    if flops < 2 * FLOPS_PER_THREAD:
        return 1  # one thread on any machine (and the CPUs not looked up)
    return threads_for_work(flops, available_cpus())


class ThreadTuner:
    """Chooses between one thread and the automatic count ``n`` for one kind of kernel call,
    from the times of recent calls.

    On a dedicated machine the automatic count wins whenever the work rule asks for it. On
    a shared machine another process may hold the cores, or a virtual machine's host may
    for a second or so run its virtual CPUs on fewer physical cores; a call whose threads
    wait for each other then runs *slower* on several threads than on one. The tuner keeps
    a moving average of the time (per row: the caller divides) for each count, runs the
    faster one (``n`` unless it is 15 % slower), and tries the other now and then, so that it
    follows the machine: ``n`` threads again after 50 ms and 4 calls when one thread is
    ahead (to see the machine recover soon), one thread after 250 ms and 16 calls
    otherwise (each try costs the difference once; the call counts keep calls that come
    far apart from trying at every call). Each try of ``n`` that is slower than one thread
    doubles the wait before the next, up to 16 times (0.8 s and 64 calls): under lasting
    outside load the tries cost a fraction of a percent, and a recovered machine is seen
    within a second. Results are bitwise the same for any count, so the choice only
    changes the speed.
    """

    __slots__ = ("n", "mean", "tried", "since", "seen", "backoff")

    # Weight of a new time in the moving average, and how much larger than the average a
    # time may count (one preempted call must not decide the next hundred).
    SMOOTHING = 0.25
    OUTLIER = 2.0
    # n threads stay in use until they are this much slower than one (noise must not make
    # the tuner flip to the slower count).
    MARGIN = 1.15
    # Seconds and calls on the count ahead between tries of the other: of n threads (while
    # one is ahead), of one thread (while n are).
    RETRY_TWO = 0.05
    RETRY_TWO_CALLS = 4
    RETRY_ONE = 0.25
    RETRY_ONE_CALLS = 16
    # Largest factor on RETRY_TWO and RETRY_TWO_CALLS while tries of n keep losing.
    MAX_BACKOFF = 16

    def __init__(self, n=2):
        self.n = n
        self.mean = [0.0, 0.0]  # time on 1 and n threads; 0.0: not measured yet
        self.tried = [0.0, 0.0]  # perf_counter() of the last call on 1 and n threads
        self.since = [0, 0]  # calls on the other count since the last call on 1 and n
        self.seen = [False, False]  # whether a first call (not counted) has run
        self.backoff = 1  # factor on the wait before the next try of n

    def choose(self, now):
        """The thread count (1 or n) for a call starting at ``now`` (``perf_counter()``)."""
        one, many = self.mean
        if many == 0.0:
            return self.n
        if one == 0.0:
            return 1
        if many <= self.MARGIN * one:
            due = now - self.tried[0] > self.RETRY_ONE and self.since[0] >= self.RETRY_ONE_CALLS
            return 1 if due else self.n
        wait = self.backoff
        due = (now - self.tried[1] > self.RETRY_TWO * wait
               and self.since[1] >= self.RETRY_TWO_CALLS * wait)
        return self.n if due else 1

    def record(self, n_threads, now, elapsed):
        """Account for a call started at ``now`` that took ``elapsed`` on ``n_threads``."""
        index = 0 if n_threads == 1 else 1
        self.tried[index] = now
        self.since[index] = 0
        self.since[1 - index] += 1
        if not self.seen[index]:
            # The first call on a count pays for warming up (starting workers, memory the
            # kernels touch first): not a measure of the count.
            self.seen[index] = True
            return
        mean = self.mean[index]
        if mean == 0.0:
            self.mean[index] = elapsed
        else:
            elapsed = min(elapsed, self.OUTLIER * mean)
            self.mean[index] = mean + self.SMOOTHING * (elapsed - mean)
        if index == 1:
            # A call on n while one thread was ahead is a try: a slow one makes the next
            # wait longer; a fast one brings the tries back to their usual pace, so that
            # they soon pull the average down.
            one = self.mean[0]
            if one != 0.0 and mean > self.MARGIN * one and elapsed > self.MARGIN * one:
                self.backoff = min(2 * self.backoff, self.MAX_BACKOFF)
            else:
                self.backoff = 1


class ThreadChoice:
    """A plan's thread count per kernel call: the work rule (:func:`threads_for`), and
    where a time step's work is small enough for the threads' synchronisation to matter,
    the kind of call's :class:`ThreadTuner` (n threads or one).

    Parameters
    ----------
    n_threads : int or None
        The plan's setting (None: automatic, see :func:`is_automatic`).
    new_tuner : callable or None
        ``new_tuner(n)``: a tuner between one thread and ``n`` for one kind of call, with
        :class:`ThreadTuner`'s ``choose`` and ``record`` (None: a :class:`ThreadTuner`).
    """

    def __init__(self, n_threads=None, new_tuner=None):
        self.n_threads = n_threads
        self.new_tuner = ThreadTuner if new_tuner is None else new_tuner
        self.tuners = {}  # kind of kernel call and count -> its ThreadTuner (automatic only)

    def run(self, key, rows, step_flops, flops, run):
        """``run(n_threads)``, with the thread count for a call of ``flops`` work. When the
        count is automatic and a time step's work (``step_flops``) is at most
        ``TUNED_STEP_FLOPS``, this kind of call's tuner (``key``: everything but the
        sequence length) may run it on one thread instead; it compares times per row
        (``rows`` rows), so that calls of other lengths inform one another."""
        n_threads = threads_for(flops, self.n_threads)
        if (n_threads == 1 or rows == 0 or step_flops > TUNED_STEP_FLOPS
                or not is_automatic(self.n_threads)):
            return run(n_threads)
        key = key + (n_threads,)
        tuner = self.tuners.get(key)
        if tuner is None:
            if len(self.tuners) >= 64:  # many shapes: forget the old ones
                self.tuners.clear()
            tuner = self.tuners[key] = self.new_tuner(n_threads)
        start = perf_counter()
        n_threads = tuner.choose(start)
        result = run(n_threads)
        tuner.record(n_threads, start, (perf_counter() - start) / rows)
        return result


def is_automatic(n_threads=None):
    """Whether the thread count is left to lstmcy (no setting, global or per plan)."""
    return n_threads is None and _machine.num_threads is None


class _PoolController(threadpoolctl.LibController):
    """threadpoolctl's view of lstmcy's thread pool: its limit caps automatic counts.

    ``user_api`` is "openmp", so that ``threadpool_limits(n, user_api="openmp")``, the
    usual way to keep OpenMP-threaded libraries from oversubscribing (joblib's workers
    included), limits lstmcy too."""

    user_api = "openmp"
    internal_api = "lstmcy"
    filename_prefixes = ("_threadpool",)
    check_symbols = ("lstmcy_thread_limit", "lstmcy_set_thread_limit")

    def get_num_threads(self):
        self.dynlib.lstmcy_thread_limit.restype = ctypes.c_int
        return self.dynlib.lstmcy_thread_limit() or available_cpus()

    def set_num_threads(self, num_threads):
        # A limit of all the process's CPUs limits nothing: stored as none, so that
        # restoring the count get_num_threads reported leaves no cap behind.
        limit = int(num_threads) if num_threads < _process_cpus() else 0
        self.dynlib.lstmcy_set_thread_limit.argtypes = [ctypes.c_int]
        self.dynlib.lstmcy_set_thread_limit(limit)

    def get_version(self):
        from lstmcy import __version__

        return __version__


threadpoolctl.register(_PoolController)


class _ThreadSetting:
    """Get and set one BLAS library's thread count.

    For OpenBLAS with its own (pthreads) thread pool the setting is process-wide, and
    threadpoolctl lets only the first thread that used it change it (others "silently do
    nothing"), so the library's own functions are called directly: lstmcy may be called
    from any thread. Other libraries go through threadpoolctl.
    """

    def __init__(self, controller):
        self.filepath = controller.filepath
        self.get = controller.get_num_threads
        self.set = controller.set_num_threads
        self.small_gemms = (controller.internal_api == "openblas" and str(
            getattr(controller, "architecture", "")).lower() in _OPENBLAS_SMALL_GEMM_KERNELS)
        if controller.internal_api == "openblas" and getattr(controller, "threading_layer", "") != "openmp":
            try:
                prefix, suffix = controller._find_affixes()
                get = getattr(controller.dynlib, f"{prefix}openblas_get_num_threads{suffix}")
                set_ = getattr(controller.dynlib, f"{prefix}openblas_set_num_threads{suffix}")
            except (AttributeError, TypeError):
                return
            get.restype = ctypes.c_int
            set_.restype = None
            set_.argtypes = [ctypes.c_int]
            self.get, self.set = get, set_


#: OpenBLAS kernel families (``openblas_get_corename``) with a path for small GEMMs (see
#: lstmcy._engine.schedule.SMALL_GEMM).
_OPENBLAS_SMALL_GEMM_KERNELS = {"skylakex", "cooperlake", "sapphirerapids"}


@functools.lru_cache(maxsize=1)
def blas_small_gemms():
    """Whether the BLAS behind ``scipy.linalg.cython_blas`` multiplies small GEMMs without
    packing them (see :data:`lstmcy._engine.schedule.SMALL_GEMM`): a fact of the process, read once."""
    return all_have_small_gemms(_blas_controllers())


def all_have_small_gemms(settings):
    """Whether every BLAS library of ``settings`` (:class:`_ThreadSetting`, at least one)
    has the path for small GEMMs."""
    return bool(settings) and all(lib.small_gemms for lib in settings)


def _blas_controllers():
    """Thread settings of the BLAS behind ``scipy.linalg.cython_blas``."""
    global _controllers
    if _controllers is None:
        import scipy
        import scipy.linalg.cython_blas  # noqa: F401  (make sure it is loaded)

        blas = threadpoolctl.ThreadpoolController().select(user_api="blas")
        scipy_dir = os.path.dirname(os.path.dirname(scipy.__file__))
        # Prefer the copy scipy ships (scipy.libs/...); otherwise cap every BLAS.
        own = [lib for lib in blas.lib_controllers
               if os.path.basename(os.path.dirname(lib.filepath)).startswith("scipy")
               and os.path.dirname(os.path.dirname(lib.filepath)) == scipy_dir]
        _controllers = [_ThreadSetting(lib) for lib in (own or blas.lib_controllers)]
    return _controllers


_NO_CAP = contextlib.nullcontext()  # reusable and re-entrant


def blas_single_threaded(active=True):
    """Keep scipy's BLAS on one thread inside the block (re-entrant, thread-safe).

    With ``active=False`` it does nothing (for calls too small for BLAS to use threads).
    """
    return _CAP if active else _NO_CAP


class _CappedBlas:
    """The cap as a stateless, reusable context manager (every kernel call enters one: a
    class is cheaper to enter than a generator-based ``contextmanager``); the count of
    blocks inside it and the saved settings are module state, under ``_lock``."""

    __slots__ = ()

    def __enter__(self):
        global _active, _saved
        with _lock:
            if _active == 0:
                controllers = _blas_controllers()
                _saved = [(lib, lib.get()) for lib in controllers]
                for lib, threads in _saved:
                    if threads != 1:
                        lib.set(1)
            _active += 1
        return self

    def __exit__(self, *exc_info):
        global _active, _saved
        with _lock:
            _active -= 1
            if _active == 0:
                for lib, threads in _saved:
                    if threads != 1:
                        lib.set(threads)
                _saved = []
        return False


_CAP = _CappedBlas()


def _after_fork_in_child():
    """A forked child has only the thread that forked: the cap's lock may be held by a
    thread that is gone, and BLAS may be capped for a call that will never end. Start
    afresh, with BLAS's own setting back, and read the CPUs again (a child may be moved)."""
    global _lock, _active, _saved
    _lock = threading.Lock()
    if _active:
        for lib, threads in _saved:
            if threads != 1:
                lib.set(threads)
    _active = 0
    _saved = []
    _machine.cpus = None


os.register_at_fork(after_in_child=_after_fork_in_child)
