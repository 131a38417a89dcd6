/* Round trip of one cache line between two threads (two cores, or two hyperthreads of
 * one core), the cost under every per-step barrier of the split forward.
 *
 *   cc -O2 -pthread tools/core_roundtrip.c -o /tmp/core_roundtrip && /tmp/core_roundtrip
 *
 * On the 2-vCPU benchmark VM it prints either ~30-100 ns (the two vCPUs share a physical
 * core: cheap to synchronise, but two busy threads share one core's execution units) or
 * ~340-380 ns (two cores: full throughput, costly synchronisation); the host moves the
 * vCPUs between the two placements from one minute to the next. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#define ROUNDS 200000
static volatile long flag __attribute__((aligned(64)));

static void *partner(void *arg) {
    (void)arg;
    for (long i = 0; i < ROUNDS; i++) {
        while (flag != 2 * i + 1) __builtin_ia32_pause();
        flag = 2 * i + 2;
    }
    return NULL;
}

int main(void) {
    pthread_t thread;
    struct timespec start, end;
    pthread_create(&thread, NULL, partner, NULL);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < ROUNDS; i++) {
        flag = 2 * i + 1;
        while (flag != 2 * i + 2) __builtin_ia32_pause();
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    pthread_join(thread, NULL);
    printf("round trip %.1f ns\n",
           ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / ROUNDS);
    return 0;
}
