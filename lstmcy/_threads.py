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
from contextlib import contextmanager, nullcontext

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
    ``threadpoolctl.threadpool_limits``) allows two. Results are bitwise identical either way.
    """
    global _num_threads
    if n_threads is not None:
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise ValueError(f"n_threads must be a positive int or None, got {n_threads!r}")
    _num_threads = n_threads


def get_num_threads():
    """The thread setting: an int, or None for automatic."""
    return _num_threads


def threads_for(flops, n_units, n_threads=None):
    """Threads to use for a layer with ``flops`` work split in ``n_units`` parallel units."""
    setting = _num_threads if n_threads is None else n_threads
    if setting is None:
        # Below ~2 MFLOP the start-up of a parallel region costs more than it saves. The
        # OpenMP limit (OMP_NUM_THREADS, threadpoolctl, joblib's workers) is respected.
        if n_units < 2 or flops < 2e6 or _cores() < 2:
            return 1  # decided without the import below (small calls are the frequent ones)
        from lstmcy._lstm import omp_max_threads

        return 2 if omp_max_threads() >= 2 else 1
    return 2 if setting >= 2 else 1


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
    return _capped_blas() if active else _NO_CAP


@contextmanager
def _capped_blas():
    global _active, _saved
    with _lock:
        if _active == 0:
            controllers = _blas_controllers()
            _saved = [(lib, lib.get()) for lib in controllers]
            for lib, threads in _saved:
                if threads != 1:
                    lib.set(1)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                for lib, threads in _saved:
                    if threads != 1:
                        lib.set(threads)
                _saved = []
