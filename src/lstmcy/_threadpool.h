/* lstmcy's thread pool: persistent worker threads that run the kernels' jobs.

   A job is one function run by n threads at once, fn(ctx, worker, n_workers) with worker
   0 the calling thread; it returns once every part that started has returned. The kernels
   split their work into tasks that any part may take, so a job is correct on any number
   of threads, and the pool may give a call fewer than it asked for: when several threads
   call the kernels at once, each takes the idle workers there are, and a call that finds
   none runs on its own thread. A part handed to a worker that has not started it by the
   time the caller's own part returns (all the work was taken: with more threads than
   cores, a woken worker may wait a scheduler slice for a core) is withdrawn: the job ends
   without waiting for that worker to be scheduled, and the worker skips it. The pool
   holds at most n - 1 workers for the largest n asked for, so lstmcy adds no more
   threads than that to the callers' own.

   A job starts as many threads as the process may use CPUs (affinity and quota, set from
   Python): parts beyond them are spares, handed one at a time by a thread of the job
   that is about to sleep in a wait (lstmcy_job_wait), so the core it leaves works for
   the job meanwhile. More threads than cores running at once would only take
   turns on them, each one the scheduler leaves without a core holding up the others.

   Workers wait for a job by spinning for 300 us (consecutive kernel calls, such as the
   layers of one forward, then find them awake) and then sleeping on a futex; they never
   spin without bound. The pool starts workers when a job first needs them.

   Fork: a child process has only the thread that called fork. A handler run in the
   child (pthread_atfork) forgets the parent's workers, so the child's first job starts
   its own; the child's calls complete and give the same results.

   The thread limit is where threadpoolctl's controller for lstmcy reads and writes the
   limit of automatic thread counts (exported symbols: lstmcy_thread_limit and
   lstmcy_set_thread_limit). */
#ifndef LSTMCY_THREADPOOL_H
#define LSTMCY_THREADPOOL_H
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "_sync.h"

typedef void (*lstmcy_job_fn)(void *ctx, int worker, int n_workers);

struct lstmcy_worker;

typedef struct {
    lstmcy_job_fn fn;
    void *ctx;
    int n_workers;
    int flush_denormals;
    struct lstmcy_worker **spares;  /* reserved workers whose parts wait for a free core */
    int n_spares;
    int next_spare;                 /* spares handed (or claimed) so far */
} lstmcy_job;

/* A worker's hold on its part of the job it is reserved for: NONE (not handed: idle, or a
   spare not yet handed), HANDED (its go sent), RUNNING, DONE (returned), CLOSED (a spare
   the caller closed before anyone handed it). The caller resets it to NONE when it
   releases the worker. */
enum { LSTMCY_PART_NONE = 0, LSTMCY_PART_HANDED = 1, LSTMCY_PART_RUNNING = 2,
       LSTMCY_PART_DONE = 3, LSTMCY_PART_CLOSED = 4 };

/* A job lives on its caller's stack, so a worker signals its part's end in its own struct
   (done), which outlives every job: the caller returns once each started part's done has
   advanced, and the worker's last touch of the job is before that advance. */
typedef struct lstmcy_worker {
    pthread_t thread;
    lstmcy_event go;        /* jobs handed to this worker so far */
    lstmcy_event done;      /* 1 once it has returned from its part of the current job */
    lstmcy_job *job;        /* the job handed with the latest go */
    int part;               /* its worker index in that job */
    int state;              /* LSTMCY_PART_*: the caller withdraws a part still HANDED */
    int busy;               /* taken by a caller (under the pool lock) */
} lstmcy_worker;

/* How long an idle worker spins for the next job before it sleeps: consecutive kernel
   calls (the layers of a forward; a training step's forward and backward with Python in
   between) find it awake. Spinning, not yielding: a thread that yields to another
   process's can lose its core for a whole scheduler tick, a sleeping one is woken in
   microseconds. */
#define LSTMCY_IDLE_SPIN_NS 300000LL
/* How long a wait inside a job spins before it sleeps (see _sync.h). */
#define LSTMCY_WAIT_SPIN_NS 50000LL

static struct {
    pthread_mutex_t lock;
    lstmcy_worker **workers;  /* stable addresses: workers read their own struct */
    int n_workers;
    int capacity;
    int cpus;                 /* CPUs the process may use (set from Python) */
    int forks;                /* fork()s this process has come from, counted in the child */
    int withdrawn;            /* parts withdrawn before their worker started them */
    int spares_handed;        /* spare parts handed to a core a waiting thread left */
} lstmcy_pool = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 1, 0, 0, 0};

/* 0: no limit. Written by threadpoolctl (through ctypes) and by lstmcy's Python. */
int lstmcy_thread_limit_value = 0;

int lstmcy_thread_limit(void) { return __atomic_load_n(&lstmcy_thread_limit_value, __ATOMIC_RELAXED); }

void lstmcy_set_thread_limit(int limit)
{
    __atomic_store_n(&lstmcy_thread_limit_value, limit > 0 ? limit : 0, __ATOMIC_RELAXED);
}

#ifdef LSTMCY_TEST_HOOKS
/* Debug builds: LSTMCY_TEST_START_DELAY_US="part:us[,part:us...]" makes the part of every
   job with that worker index start late (tests: a thread that wakes late or loses its
   core must only delay the result, never change it); LSTMCY_TEST_WAKE_DELAY_US, in the
   same form, makes the worker handed that part sleep before it takes it (so that the
   caller may withdraw it first). */
#include <stdio.h>
static void lstmcy_test_delay(const char *variable, int part)
{
    const char *spec = getenv(variable);
    while (spec != NULL && *spec) {
        int which = -1;
        long long us = 0;
        if (sscanf(spec, "%d:%lld", &which, &us) == 2 && which == part && us > 0)
            lstmcy_sleep_ns(us * 1000);
        spec = strchr(spec, ',');
        if (spec != NULL)
            spec++;
    }
}
#endif

/* The job whose part this thread is running (NULL outside one, and on OpenMP teams). */
static __thread lstmcy_job *lstmcy_current_job = NULL;

/* Called by a thread of a job about to sleep in a wait: hand the next spare part, if the
   job has one left, so that the core this thread leaves works for the job meanwhile. */
static void lstmcy_hand_spare(void)
{
    lstmcy_job *job = lstmcy_current_job;
    if (job == NULL || __atomic_load_n(&job->next_spare, __ATOMIC_RELAXED) >= job->n_spares)
        return;
    int k = __atomic_fetch_add(&job->next_spare, 1, __ATOMIC_ACQ_REL);
    if (k >= job->n_spares)
        return;
    struct lstmcy_worker *w = job->spares[k];
    int none = LSTMCY_PART_NONE;
    /* Fails only when the caller has closed it: the job is ending. */
    if (__atomic_compare_exchange_n(&w->state, &none, LSTMCY_PART_HANDED, 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        __atomic_add_fetch(&lstmcy_pool.spares_handed, 1, __ATOMIC_RELAXED);
        lstmcy_event_add(&w->go, 1);
    }
}

/* A wait inside a job: as lstmcy_event_wait, and a thread about to sleep hands a spare. */
static void lstmcy_job_wait(lstmcy_event *e, int target, long long spin_ns)
{
    lstmcy_event_wait_hooked(e, target, spin_ns, lstmcy_hand_spare);
}

static void lstmcy_run_part(lstmcy_job *job, int part)
{
    unsigned mode = 0;
    lstmcy_job *outer = lstmcy_current_job;
    lstmcy_current_job = job;
    if (job->flush_denormals)
        mode = lstmcy_flush_denormals();
#ifdef LSTMCY_TEST_HOOKS
    lstmcy_test_delay("LSTMCY_TEST_START_DELAY_US", part);
#endif
    job->fn(job->ctx, part, job->n_workers);
    if (job->flush_denormals)
        lstmcy_restore_fp_mode(mode);
    lstmcy_current_job = outer;
}

static void *lstmcy_worker_main(void *arg)
{
    lstmcy_worker *self = (lstmcy_worker *)arg;
    int seen = 0;
    long long idle_spin = LSTMCY_IDLE_SPIN_NS;
    for (;;) {
        /* the count wraps after 2**31 jobs: the next one computed without overflow */
        lstmcy_event_wait(&self->go, (int)((unsigned)seen + 1u), idle_spin);
        /* Every go up to now: one whose part was withdrawn before this worker woke is void
           (its job may be gone); the latest part, if still handed, is this worker's. */
        seen = lstmcy_event_get(&self->go);
#ifdef LSTMCY_TEST_HOOKS
        lstmcy_test_delay("LSTMCY_TEST_WAKE_DELAY_US", __atomic_load_n(&self->part, __ATOMIC_RELAXED));
#endif
        int handed = LSTMCY_PART_HANDED;
        if (!__atomic_compare_exchange_n(&self->state, &handed, LSTMCY_PART_RUNNING, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        lstmcy_job *job = self->job;  /* published before the part was handed */
        /* A part beyond the CPUs (a spare) sleeps at once when idle: spinning, it would
           take a core from the threads still working. */
        idle_spin = self->part >= __atomic_load_n(&lstmcy_pool.cpus, __ATOMIC_RELAXED)
                    ? 0 : LSTMCY_IDLE_SPIN_NS;
        lstmcy_run_part(job, self->part);
        /* job lives on the caller's stack: not touched from here on */
        __atomic_store_n(&self->state, LSTMCY_PART_DONE, __ATOMIC_RELEASE);
        lstmcy_event_add(&self->done, 1);
    }
    return NULL;
}

/* Start one more worker (under the lock); 0 on failure. */
static int lstmcy_pool_grow(void)
{
    if (lstmcy_pool.n_workers == lstmcy_pool.capacity) {
        int capacity = lstmcy_pool.capacity ? 2 * lstmcy_pool.capacity : 8;
        lstmcy_worker **grown = (lstmcy_worker **)realloc(lstmcy_pool.workers,
                                                          capacity * sizeof(lstmcy_worker *));
        if (grown == NULL)
            return 0;
        lstmcy_pool.workers = grown;
        lstmcy_pool.capacity = capacity;
    }
    lstmcy_worker *w = (lstmcy_worker *)calloc(1, sizeof(lstmcy_worker));
    if (w == NULL)
        return 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* the kernels and BLAS use little stack: 4 MiB rather than the 8 MiB default */
    pthread_attr_setstacksize(&attr, 4 << 20);
    int failed = pthread_create(&w->thread, &attr, lstmcy_worker_main, w);
    pthread_attr_destroy(&attr);
    if (failed) {
        free(w);
        return 0;
    }
    lstmcy_pool.workers[lstmcy_pool.n_workers++] = w;
    return 1;
}

/* An OpenMP runtime's team instead of the pool (libgomp's GOMP_parallel, set from
   Python by lstmcy.torch: torch's own libgomp). torch's OpenMP workers spin for
   milliseconds after each of torch's parallel regions; lstmcy's workers running meanwhile
   would share the cores with them. Run on that team, a kernel call uses the very threads
   that spin (they are its workers), and lstmcy's own workers stay asleep. Used by the
   threads that asked for it (lstmcy_pool_use_omp, per thread: the torch engine's calls),
   never in a forked child (libgomp's team did not come along). */
typedef void (*lstmcy_gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned n_threads,
                                        unsigned flags);
typedef int (*lstmcy_omp_int_fn)(void);
static lstmcy_gomp_parallel_fn lstmcy_gomp_parallel = NULL;
static lstmcy_omp_int_fn lstmcy_omp_thread_num = NULL;
static lstmcy_omp_int_fn lstmcy_omp_num_threads = NULL;
static lstmcy_omp_int_fn lstmcy_omp_in_parallel = NULL;
static __thread int lstmcy_use_omp = 0;

/* A wait's spin time in a job of n threads. The pool runs about as many of a job's
   threads at once as the process may use CPUs (the others are spares), so its waits
   spin; an OpenMP team runs all of its threads, and with more than the CPUs the thread
   waited for may be the one not running: its waits sleep at once. */
static inline long long lstmcy_pool_spin_ns(int n_threads)
{
#ifdef LSTMCY_TEST_HOOKS
    /* Debug builds: LSTMCY_TEST_WAIT_SPIN_NS sets every wait's spin (0: waits sleep at
       once, so that tests see the threads of a job sleep and hand their spares). */
    const char *spin = getenv("LSTMCY_TEST_WAIT_SPIN_NS");
    if (spin != NULL && *spin)
        return atoll(spin);
#endif
    if (lstmcy_use_omp && lstmcy_gomp_parallel != NULL
            && n_threads > __atomic_load_n(&lstmcy_pool.cpus, __ATOMIC_RELAXED))
        return 0;
    return LSTMCY_WAIT_SPIN_NS;
}

static void lstmcy_pool_set_omp(void *gomp_parallel, void *thread_num, void *num_threads,
                                void *in_parallel)
{
    if (gomp_parallel == NULL || thread_num == NULL || num_threads == NULL || in_parallel == NULL)
        gomp_parallel = thread_num = num_threads = in_parallel = NULL;
    lstmcy_omp_thread_num = (lstmcy_omp_int_fn)thread_num;
    lstmcy_omp_num_threads = (lstmcy_omp_int_fn)num_threads;
    lstmcy_omp_in_parallel = (lstmcy_omp_int_fn)in_parallel;
    lstmcy_gomp_parallel = (lstmcy_gomp_parallel_fn)gomp_parallel;
}

/* Whether the calling thread's jobs run on the OpenMP team; returns the previous setting. */
static int lstmcy_pool_use_omp(int use)
{
    int previous = lstmcy_use_omp;
    lstmcy_use_omp = use;
    return previous;
}

static void lstmcy_omp_part(void *arg)
{
    lstmcy_job *job = (lstmcy_job *)arg;
    int part = lstmcy_omp_thread_num();
    unsigned mode = 0;
    if (part == 0)
        job->n_workers = lstmcy_omp_num_threads();
    if (job->flush_denormals)
        mode = lstmcy_flush_denormals();
    job->fn(job->ctx, part, lstmcy_omp_num_threads());
    if (job->flush_denormals)
        lstmcy_restore_fp_mode(mode);
}

/* Run fn on up to n_threads threads (this one included); returns how many ran it. */
static int lstmcy_pool_run(int n_threads, lstmcy_job_fn fn, void *ctx, int flush_denormals)
{
    lstmcy_job job;
    lstmcy_worker *taken[256];
    int n_taken = 0;
    memset(&job, 0, sizeof job);
    job.fn = fn;
    job.ctx = ctx;
    job.flush_denormals = flush_denormals;
    if (n_threads > 257)
        n_threads = 257;
    /* not inside a parallel region: a nested team would have one thread */
    if (n_threads > 1 && lstmcy_use_omp && lstmcy_gomp_parallel != NULL
            && !lstmcy_omp_in_parallel()) {
        job.n_workers = 1;
        lstmcy_gomp_parallel(lstmcy_omp_part, &job, (unsigned)n_threads, 0);
        return job.n_workers;
    }
    if (n_threads > 1) {
        pthread_mutex_lock(&lstmcy_pool.lock);
        for (int k = 0; k < lstmcy_pool.n_workers && n_taken < n_threads - 1; k++) {
            if (!lstmcy_pool.workers[k]->busy) {
                lstmcy_pool.workers[k]->busy = 1;
                taken[n_taken++] = lstmcy_pool.workers[k];
            }
        }
        /* Start workers only while every existing one is taken, and never more than a
           call asks for: concurrent callers share the pool rather than each growing it,
           so lstmcy never adds more threads than the largest count asked for. */
        while (n_taken < n_threads - 1 && lstmcy_pool.n_workers < n_threads - 1
               && lstmcy_pool_grow()) {
            lstmcy_worker *w = lstmcy_pool.workers[lstmcy_pool.n_workers - 1];
            w->busy = 1;
            taken[n_taken++] = w;
        }
        pthread_mutex_unlock(&lstmcy_pool.lock);
    }
    job.n_workers = 1 + n_taken;
    /* Parts up to the CPUs start now; the others are spares, each handed when a thread of
       the job is about to sleep in a wait (lstmcy_hand_spare): more threads than CPUs
       would only take turns on the cores, but the job's threads keep the cores busy
       while some wait. */
    int cpus = __atomic_load_n(&lstmcy_pool.cpus, __ATOMIC_RELAXED);
    int n_now = n_taken < cpus - 1 ? n_taken : (cpus > 1 ? cpus - 1 : 0);
    job.spares = (struct lstmcy_worker **)(taken + n_now);
    job.n_spares = n_taken - n_now;
    for (int k = 0; k < n_taken; k++) {
        /* Counted from 0 for each job (a life's count would wrap): no increment of an
           earlier job is pending, since its caller saw it before releasing the worker. */
        __atomic_store_n(&taken[k]->done.value, 0, __ATOMIC_RELAXED);
        taken[k]->job = &job;
        /* atomic: a test build's worker woken late by an earlier go reads it before its CAS */
        __atomic_store_n(&taken[k]->part, k + 1, __ATOMIC_RELAXED);
    }
    for (int k = 0; k < n_now; k++) {
        __atomic_store_n(&taken[k]->state, LSTMCY_PART_HANDED, __ATOMIC_RELEASE);
        lstmcy_event_add(&taken[k]->go, 1);
    }
    lstmcy_run_part(&job, 0);
    if (n_taken > 0) {
        /* Close the spares not handed, withdraw the parts not started yet; wait for the
           others. */
        int started[256];
        for (int k = 0; k < n_taken; k++) {
            started[k] = 0;
            int state = __atomic_load_n(&taken[k]->state, __ATOMIC_ACQUIRE);
            for (;;) {
                int next = state == LSTMCY_PART_NONE ? LSTMCY_PART_CLOSED
                           : state == LSTMCY_PART_HANDED ? LSTMCY_PART_NONE : -1;
                if (next < 0) {  /* RUNNING or DONE */
                    started[k] = 1;
                    break;
                }
                if (__atomic_compare_exchange_n(&taken[k]->state, &state, next, 0,
                                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                    if (next == LSTMCY_PART_NONE)
                        __atomic_add_fetch(&lstmcy_pool.withdrawn, 1, __ATOMIC_RELAXED);
                    break;
                }
            }
        }
        long long spin_ns = lstmcy_pool_spin_ns(job.n_workers);
        for (int k = 0; k < n_taken; k++)
            if (started[k])
                lstmcy_event_wait(&taken[k]->done, 1, spin_ns);
        pthread_mutex_lock(&lstmcy_pool.lock);
        for (int k = 0; k < n_taken; k++) {
            __atomic_store_n(&taken[k]->state, LSTMCY_PART_NONE, __ATOMIC_RELEASE);
            taken[k]->busy = 0;
        }
        pthread_mutex_unlock(&lstmcy_pool.lock);
    }
    return job.n_workers;
}

/* In a forked child: the workers did not come along. Their structs are left allocated
   (a worker of the parent may have been mid-job; nothing in the child reads them). */
static void lstmcy_pool_after_fork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    lstmcy_pool.lock = fresh;
    lstmcy_pool.workers = NULL;
    lstmcy_pool.n_workers = 0;
    lstmcy_pool.capacity = 0;
    lstmcy_pool.forks++;
    lstmcy_gomp_parallel = NULL;
}

static int lstmcy_pool_init(void)
{
    return pthread_atfork(NULL, NULL, lstmcy_pool_after_fork_child);
}

static void lstmcy_pool_set_cpus(int cpus)
{
    __atomic_store_n(&lstmcy_pool.cpus, cpus > 0 ? cpus : 1, __ATOMIC_RELAXED);
}

static int lstmcy_pool_withdrawn(void)
{
    return __atomic_load_n(&lstmcy_pool.withdrawn, __ATOMIC_RELAXED);
}

static int lstmcy_pool_cpus(void)
{
    return __atomic_load_n(&lstmcy_pool.cpus, __ATOMIC_RELAXED);
}

static int lstmcy_pool_spares_handed(void)
{
    return __atomic_load_n(&lstmcy_pool.spares_handed, __ATOMIC_RELAXED);
}

static int lstmcy_pool_size(void)
{
    pthread_mutex_lock(&lstmcy_pool.lock);
    int n = lstmcy_pool.n_workers;
    pthread_mutex_unlock(&lstmcy_pool.lock);
    return n;
}

#endif
