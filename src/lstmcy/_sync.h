/* Synchronisation between the kernel threads: events that can be waited on, claims,
   the clock, and the floating-point mode of a kernel thread.

   An event is a counter that one thread advances and others wait for ("chunk c of the
   recurrence is done", "task k is finished"). A wait spins for a bounded time (a few
   tens of microseconds: on an idle machine the producer is running on another core and
   the wait is short), then sleeps in the kernel (a futex on Linux) until the producer
   wakes it. No wait ever spins without bound: when threads outnumber cores, or another
   process holds them, a waiting thread gives its core to the thread it waits for.

   The spin time is the caller's: the kernels pass the one the thread pool chose for the
   job, and wait through the pool (lstmcy_event_wait_hooked), which gives the core a
   sleeping thread leaves to a spare thread of the job. */
#ifndef LSTMCY_SYNC_H
#define LSTMCY_SYNC_H
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

/* One event on its own cache line: the waits of other events never share it. */
/* Waiters sleep on seq, not on value: a setter wakes them only once value reaches the
   lowest target a waiter asked for (wanted), so a thread waiting for step 30 is not woken
   at steps 1 to 29. With more threads than cores, a wake-up at every change would take
   the cores from the threads doing the work. Zeroed memory is a valid idle event. */
typedef struct {
    int value;
    int waiters;  /* threads asleep (or about to sleep) on seq */
    int wanted;   /* no more than the lowest target of the waiters registered since the last wake */
    int seq;      /* wake-ups so far: the futex word */
    char pad_[64 - 4 * sizeof(int)];
} lstmcy_event;

static inline void lstmcy_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline long long lstmcy_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void lstmcy_sleep_ns(long long ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    nanosleep(&ts, NULL);
}

/* Sleep while *word == expected (or until woken, or a timeout: a wake-up that went
   missing would cost a few milliseconds, never a hang). */
static inline void lstmcy_futex_wait(int *word, int expected)
{
#if defined(__linux__)
    struct timespec timeout = {0, 5000000};  /* 5 ms */
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, &timeout, NULL, 0);
#else
    (void)word;
    (void)expected;
    lstmcy_sleep_ns(20000);
#endif
}

static inline void lstmcy_futex_wake_all(int *word)
{
#if defined(__linux__)
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

static inline int lstmcy_event_get(lstmcy_event *e)
{
    return __atomic_load_n(&e->value, __ATOMIC_ACQUIRE);
}

static inline void lstmcy_event_wake(lstmcy_event *e, int value)
{
    /* seq_cst on both sides: either the waiter sees the new value, or this sees it waiting
       (and its target). Reset wanted before counting the wake-up: a waiter that read seq
       after the count registered after the reset, and one that read it before is woken. */
    if (__atomic_load_n(&e->waiters, __ATOMIC_SEQ_CST) > 0
            && value >= __atomic_load_n(&e->wanted, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&e->wanted, INT_MAX, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&e->seq, 1, __ATOMIC_SEQ_CST);
        lstmcy_futex_wake_all(&e->seq);
    }
}

static inline void lstmcy_event_set(lstmcy_event *e, int value)
{
    __atomic_store_n(&e->value, value, __ATOMIC_SEQ_CST);
    lstmcy_event_wake(e, value);
}

static inline void lstmcy_event_add(lstmcy_event *e, int delta)
{
    lstmcy_event_wake(e, __atomic_add_fetch(&e->value, delta, __ATOMIC_SEQ_CST));
}

/* Block until e->value >= target, spinning at most spin_ns before sleeping; each time
   before it sleeps, call before_sleep (if not NULL): the thread pool uses it to give the
   core this thread leaves to another thread of the job. */
static inline void lstmcy_event_wait_hooked(lstmcy_event *e, int target, long long spin_ns,
                                            void (*before_sleep)(void))
{
    if (lstmcy_event_get(e) >= target)
        return;
    long long start = spin_ns > 0 ? lstmcy_now_ns() : 0;
    unsigned spins = 0;
    while (spin_ns > 0 && lstmcy_event_get(e) < target) {
        lstmcy_cpu_relax();
        /* the clock costs more than a PAUSE: read it now and then */
        if ((++spins & 63) == 0 && lstmcy_now_ns() - start >= spin_ns)
            break;
    }
    if (lstmcy_event_get(e) >= target)
        return;
    __atomic_add_fetch(&e->waiters, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        int seq = __atomic_load_n(&e->seq, __ATOMIC_SEQ_CST);
        int wanted = __atomic_load_n(&e->wanted, __ATOMIC_SEQ_CST);
        while (target < wanted
               && !__atomic_compare_exchange_n(&e->wanted, &wanted, target, 0, __ATOMIC_SEQ_CST,
                                               __ATOMIC_SEQ_CST)) {
        }
        if (__atomic_load_n(&e->value, __ATOMIC_SEQ_CST) >= target)
            break;
        if (before_sleep != NULL)
            before_sleep();
        lstmcy_futex_wait(&e->seq, seq);
    }
    __atomic_sub_fetch(&e->waiters, 1, __ATOMIC_SEQ_CST);
}

/* Block until e->value >= target, spinning at most spin_ns before sleeping. */
static inline void lstmcy_event_wait(lstmcy_event *e, int target, long long spin_ns)
{
    lstmcy_event_wait_hooked(e, target, spin_ns, NULL);
}

static inline int lstmcy_load_acquire(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* The next index of a shared counter (each index goes to exactly one thread). */
static inline int lstmcy_take_next(int *counter)
{
    return __atomic_fetch_add(counter, 1, __ATOMIC_ACQ_REL);
}

static inline void lstmcy_store_release(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* Replace *p by desired if it still is expected: whether it did. */
static inline int lstmcy_compare_exchange(int *p, int expected, int desired)
{
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* Take the task guarded by *flag (0 while nobody has): whether this thread got it. */
static inline int lstmcy_claim(int *flag)
{
    int expected = 0;
    return __atomic_load_n(flag, __ATOMIC_ACQUIRE) == 0
           && __atomic_compare_exchange_n(flag, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE);
}

static inline void lstmcy_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }

/* Flush-to-zero and denormals-are-zero for the calling thread; returns the previous mode
   for lstmcy_restore_fp_mode. Subnormal operands and results cost 10-100x a normal
   operation on x86; a gradient that decays through a long recurrence reaches them. */
static inline unsigned lstmcy_flush_denormals(void)
{
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u);  /* FTZ (bit 15) | DAZ (bit 6) */
    return old;
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr | (1ull << 24)));  /* FZ */
    return (unsigned)fpcr;
#else
    return 0;
#endif
}

static inline void lstmcy_restore_fp_mode(unsigned old)
{
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
    _mm_setcsr(old);
#elif defined(__aarch64__)
    uint64_t fpcr = old;
    __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr));
#else
    (void)old;
#endif
}

static inline unsigned lstmcy_fp_mode(void)
{
#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
    return _mm_getcsr();
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
    return (unsigned)fpcr;
#else
    return 0;
#endif
}

#endif
