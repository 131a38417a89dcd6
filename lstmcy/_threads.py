"""Thread settings: how many threads the kernels use, and keeping BLAS single-threaded.

The kernels split their work over (at most) two OpenMP threads themselves and call BLAS
from each of them, so BLAS must run single-threaded meanwhile, or the two would
oversubscribe the cores. :func:`blas_single_threaded` caps the BLAS library that
``scipy.linalg.cython_blas`` uses (found once with threadpoolctl) for the duration of a
kernel call and restores it afterwards; concurrent callers share one cap.
"""
import ctypes
import os
import threading
from contextlib import nullcontext

_lock = threading.Lock()
_active = 0
_saved = []
_controllers = None
_num_threads = None  # None: automatic


def available_cores():
    """Number of CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_cores_cache = []


def _cores():
    if not _cores_cache:
        _cores_cache.append(available_cores())
    return _cores_cache[0]


def set_num_threads(n_threads):
    """Set the number of threads lstmcy's kernels use: 1, 2, or None for automatic.

    Automatic uses two threads for problems large enough to gain from them when the
    process may run on at least two CPUs and the OpenMP limit (``OMP_NUM_THREADS``,
    ``threadpoolctl.threadpool_limits``) allows two; on small problems it times its calls
    and uses one thread while two are slower (:class:`ThreadTuner`). Results are bitwise
    identical either way.
    """
    global _num_threads
    if n_threads is not None:
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise ValueError(f"n_threads must be a positive int or None, got {n_threads!r}")
    _num_threads = n_threads


def get_num_threads():
    """The thread setting: an int, or None for automatic."""
    return _num_threads


_omp_max_threads_function = []


def _omp_max_threads():
    """OpenMP's current thread limit (imported on first use: the kernels load OpenMP)."""
    if not _omp_max_threads_function:
        from lstmcy._lstm import omp_max_threads

        _omp_max_threads_function.append(omp_max_threads)
    return _omp_max_threads_function[0]()


def threads_for(flops, n_units, n_threads=None):
    """Threads to use for a layer with ``flops`` work split in ``n_units`` parallel units."""
    setting = _num_threads if n_threads is None else n_threads
    if setting is None:
        # Below ~2 MFLOP the start-up of a parallel region costs more than it saves. The
        # OpenMP limit (OMP_NUM_THREADS, threadpoolctl, joblib's workers) is respected.
        if n_units < 2 or flops < 2e6 or _cores() < 2:
            return 1
        return 2 if _omp_max_threads() >= 2 else 1
    return 2 if setting >= 2 else 1


class ThreadTuner:
    """Chooses one or two threads for one kind of kernel call from the times of recent calls.

    On a dedicated two-core machine two threads win whenever :func:`threads_for` asks for
    them. On a shared virtual machine the host may, for a second or so at a time, run the
    two virtual CPUs on one physical core or take one away; a kernel that synchronises
    every time step then runs *slower* on two threads than on one (measured here: a
    32x16x64 forward, with a barrier per step as the split forward had then, took 880 µs
    on two threads against 480 µs on one in such periods, 320 µs otherwise). The tuner
    keeps a moving average of the time (per row: the caller divides) for each count, runs
    the faster one (two unless they are 15 % slower), and tries the other now and then,
    so that it follows the machine: two threads again after 50 ms and 4 calls when one
    thread is ahead (to see the machine recover soon), one thread after 250 ms and 16
    calls otherwise (each try costs the difference once; the call counts keep calls that
    come far apart from trying at every call). Results are bitwise the same for one or two
    threads, so the choice only changes the speed.
    """

    __slots__ = ("mean", "tried", "since", "seen")

    # Weight of a new time in the moving average, and how much larger than the average a
    # time may count (one preempted call must not decide the next hundred).
    SMOOTHING = 0.25
    OUTLIER = 2.0
    # Two threads stay in use until they are this much slower than one (noise must not
    # make the tuner flip to the slower count).
    MARGIN = 1.15
    # Seconds and calls on the count ahead between tries of the other: of two threads
    # (while one is ahead), of one thread (while two are).
    RETRY_TWO = 0.05
    RETRY_TWO_CALLS = 4
    RETRY_ONE = 0.25
    RETRY_ONE_CALLS = 16

    def __init__(self):
        self.mean = [0.0, 0.0]  # time on 1 and 2 threads; 0.0: not measured yet
        self.tried = [0.0, 0.0]  # perf_counter() of the last call on 1 and 2 threads
        self.since = [0, 0]  # calls on the other count since the last call on 1 and 2
        self.seen = [False, False]  # whether a first call (not counted) has run

    def choose(self, now):
        """The thread count (1 or 2) for a call starting at ``now`` (``perf_counter()``)."""
        one, two = self.mean
        if two == 0.0:
            return 2
        if one == 0.0:
            return 1
        if two <= self.MARGIN * one:
            due = now - self.tried[0] > self.RETRY_ONE and self.since[0] >= self.RETRY_ONE_CALLS
            return 1 if due else 2
        due = now - self.tried[1] > self.RETRY_TWO and self.since[1] >= self.RETRY_TWO_CALLS
        return 2 if due else 1

    def record(self, n_threads, now, elapsed):
        """Account for a call started at ``now`` that took ``elapsed`` on ``n_threads``."""
        index = 0 if n_threads == 1 else 1
        self.tried[index] = now
        self.since[index] = 0
        self.since[1 - index] += 1
        if not self.seen[index]:
            # The first call on a count pays for warming up (its OpenMP threads, memory
            # the kernels touch first): not a measure of the count.
            self.seen[index] = True
            return
        mean = self.mean[index]
        if mean == 0.0:
            self.mean[index] = elapsed
        else:
            elapsed = min(elapsed, self.OUTLIER * mean)
            self.mean[index] = mean + self.SMOOTHING * (elapsed - mean)


def is_automatic(n_threads=None):
    """Whether the thread count is left to lstmcy (no setting, global or per plan)."""
    return n_threads is None and _num_threads is None


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


def _blas_controllers():
    """Thread settings of the BLAS behind ``scipy.linalg.cython_blas``."""
    global _controllers
    if _controllers is None:
        import scipy
        import scipy.linalg.cython_blas  # noqa: F401  (make sure it is loaded)
        from threadpoolctl import ThreadpoolController

        blas = ThreadpoolController().select(user_api="blas")
        scipy_dir = os.path.dirname(os.path.dirname(scipy.__file__))
        # Prefer the copy scipy ships (scipy.libs/...); otherwise cap every BLAS.
        own = [lib for lib in blas.lib_controllers
               if os.path.basename(os.path.dirname(lib.filepath)).startswith("scipy")
               and os.path.dirname(os.path.dirname(lib.filepath)) == scipy_dir]
        _controllers = [_ThreadSetting(lib) for lib in (own or blas.lib_controllers)]
    return _controllers


_NO_CAP = nullcontext()  # reusable and re-entrant


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
