"""lstmcy's thread pool: the worker threads that run the kernels' jobs.

The implementation is C (``_threadpool.h``); the kernel modules call :func:`run_job`
through this module, so that the whole process shares one pool. The Python functions
here serve :mod:`lstmcy._threads` (CPU count, thread limit) and the tests (pool size, fork
count, withdrawn parts, whether the debug build's test hooks are compiled in).
"""

from lstmcy._sync cimport lstmcy_event

cdef extern from "_threadpool.h" nogil:
    ctypedef void (*lstmcy_job_fn)(void *ctx, int worker, int n_workers) noexcept nogil
    int lstmcy_pool_run(int n_threads, lstmcy_job_fn fn, void *ctx, int flush_denormals)
    long long lstmcy_pool_spin_ns(int n_threads)
    int lstmcy_pool_init()
    void lstmcy_pool_set_cpus(int cpus)
    int lstmcy_pool_size()
    int lstmcy_thread_limit()
    void lstmcy_set_thread_limit(int limit)
    int lstmcy_fork_count "lstmcy_pool.forks"
    int lstmcy_pool_withdrawn()
    int lstmcy_pool_spares_handed()
    int lstmcy_pool_cpus()
    void lstmcy_job_wait(lstmcy_event *e, int target, long long spin_ns)
    unsigned lstmcy_fp_mode()
    void lstmcy_pool_set_omp(void *gomp_parallel, void *thread_num, void *num_threads,
                             void *in_parallel)
    int lstmcy_pool_use_omp(int use)

cdef extern from *:
    """
    #ifdef LSTMCY_TEST_HOOKS
    #define LSTMCY_HAS_TEST_HOOKS 1
    #else
    #define LSTMCY_HAS_TEST_HOOKS 0
    #endif
    """
    bint LSTMCY_HAS_TEST_HOOKS

#: Whether this build reads the test hooks (``LSTMCY_DEBUG=1`` builds only).
HAS_TEST_HOOKS = LSTMCY_HAS_TEST_HOOKS

if lstmcy_pool_init() != 0:
    raise OSError("lstmcy: could not register the thread pool's fork handler")


cdef int run_job(int n_threads, job_fn fn, void *ctx, bint flush_denormals) noexcept nogil:
    """Run ``fn(ctx, worker, n_workers)`` on up to ``n_threads`` threads, the calling one
    as worker 0; returns ``n_workers``, the number that ran it."""
    return lstmcy_pool_run(n_threads, <lstmcy_job_fn>fn, ctx, flush_denormals)


cdef void job_wait(lstmcy_event *e, int target, long long spin_ns) noexcept nogil:
    """Wait inside a job until ``e`` reaches ``target`` (spinning at most ``spin_ns``); a
    thread about to sleep hands one of the job's spare parts to a worker, if any is left."""
    lstmcy_job_wait(e, target, spin_ns)


cdef long long wait_spin_ns(int n_threads) noexcept nogil:
    """How long a wait inside a job of ``n_threads`` spins before it sleeps."""
    return lstmcy_pool_spin_ns(n_threads)


def set_cpu_count(int cpus):
    """Tell the pool how many CPUs the process may use (a job runs at most that many
    threads at once; the others are spares)."""
    lstmcy_pool_set_cpus(cpus)


def cpu_count():
    """The CPUs the pool believes the process may use (1 until told)."""
    return lstmcy_pool_cpus()


def spin_ns(int n_threads):
    """How long a wait inside a job of ``n_threads`` spins before it sleeps (the calling
    thread's jobs on torch's OpenMP team: 0 with more threads than the CPUs set by
    :func:`set_cpu_count`)."""
    return wait_spin_ns(n_threads)


def pool_size():
    """Worker threads started in this process (the callers' own threads not counted)."""
    return lstmcy_pool_size()


def fork_count():
    """How many fork()s this process descends from since the pool was loaded."""
    return lstmcy_fork_count


def withdrawn_parts():
    """Parts of jobs withdrawn from a worker that had not started them when the caller's
    own part returned (the job then ended without waiting for that worker)."""
    return lstmcy_pool_withdrawn()


def spares_handed():
    """Spare parts of jobs (those beyond the CPUs) handed to a worker because a thread of
    the job was about to sleep in a wait."""
    return lstmcy_pool_spares_handed()


def thread_limit():
    """The limit of automatic thread counts (threadpoolctl's), or 0 for none."""
    return lstmcy_thread_limit()


def set_thread_limit(int limit):
    """Set the limit of automatic thread counts (0: none)."""
    lstmcy_set_thread_limit(limit)


def fp_mode():
    """The calling thread's floating-point control word (x86: MXCSR), for tests."""
    return lstmcy_fp_mode()


def set_omp_runtime(size_t gomp_parallel, size_t thread_num, size_t num_threads,
                    size_t in_parallel):
    """Give the pool libgomp's ``GOMP_parallel``, ``omp_get_thread_num``,
    ``omp_get_num_threads`` and ``omp_in_parallel`` (addresses; 0 forgets them): the jobs
    of threads that ask for it (:func:`use_omp`), outside a parallel region, then run on
    that OpenMP team instead of lstmcy's workers."""
    lstmcy_pool_set_omp(<void *>gomp_parallel, <void *>thread_num, <void *>num_threads,
                        <void *>in_parallel)


def use_omp(bint use):
    """Whether the calling thread's jobs run on the OpenMP team given to
    :func:`set_omp_runtime` (if any); returns the previous setting."""
    return bool(lstmcy_pool_use_omp(use))
