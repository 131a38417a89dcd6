# lstmcy's thread pool (see _threadpool.h): what the kernel modules cimport.
from lstmcy._sync cimport lstmcy_event

# A job: run by every thread of the call, worker 0 being the caller.
ctypedef void (*job_fn)(void *ctx, int worker, int n_workers) noexcept nogil

cdef int run_job(int n_threads, job_fn fn, void *ctx, bint flush_denormals) noexcept nogil
cdef long long wait_spin_ns(int n_threads) noexcept nogil
cdef void job_wait(lstmcy_event *e, int target, long long spin_ns) noexcept nogil
