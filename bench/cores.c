/* One cache line bounced between two CPUs by two threads pinned to them: nanoseconds per one-way hop.
   The calling thread's own affinity is left as it was. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

static _Atomic int line __attribute__((aligned(64)));
static int hops;

struct side { int cpu, send, wait, unpinned; double ns; };

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *run(void *arg) {
    struct side *s = arg;
    s->unpinned = pin(s->cpu);      /* bounced anyway: the other side waits for its hops */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < hops; i++) {
        if (s->send) atomic_store_explicit(&line, 1, memory_order_release);
        while (atomic_load_explicit(&line, memory_order_acquire) != s->wait) {}
        if (!s->send) atomic_store_explicit(&line, 0, memory_order_release);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    s->ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / hops / 2;
    return 0;
}

double core_to_core_ns(int cpu_a, int cpu_b, int n) {
    struct side a = {cpu_a, 1, 0, 0, 0}, b = {cpu_b, 0, 1, 0, 0};
    pthread_t ta, tb;
    hops = n;
    atomic_store(&line, 0);
    if (pthread_create(&tb, 0, run, &b)) return -1;
    if (pthread_create(&ta, 0, run, &a)) {          /* b still waits: answer its hops from here */
        for (int i = 0; i < n; i++) {
            atomic_store(&line, 1);
            while (atomic_load(&line) != 0) {}
        }
        pthread_join(tb, 0);
        return -1;
    }
    pthread_join(ta, 0);
    pthread_join(tb, 0);
    return a.unpinned || b.unpinned ? -1 : a.ns;
}
