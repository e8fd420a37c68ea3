/*
 * storm-bench gang: a CPU-bound SPMD program whose ranks synchronise often (the paper's Fig. 3
 * workload). Every rank computes a fixed amount of work per iteration and then waits at a
 * barrier shared by all ranks of the job, so a rank that is not coscheduled with the others
 * holds all of them up.
 *
 *   spmd ITERATIONS LOOPS_PER_ITERATION TAG
 *
 * Rank and size come from STORM_RANK / STORM_SIZE, the barrier's name from TAG and STORM_JOB_ID
 * (the benchmark gives every run its own TAG, so job ids reused by a new cluster never meet). The
 * barrier is a counter and a generation word in a file under /dev/shm that every rank maps
 * (created zero-filled by whichever rank comes first); waiters block in futex(2), so ranks that
 * wait give their core away instead of spinning.
 *
 * Rank 0 prints "spmd START_NS END_NS" (CLOCK_MONOTONIC, after the first and the last barrier).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct barrier {
    _Atomic uint32_t arrived;
    _Atomic uint32_t generation;
};

static long futex(_Atomic uint32_t *addr, int op, uint32_t val) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

static void barrier_wait(struct barrier *b, uint32_t size) {
    uint32_t gen = atomic_load(&b->generation);
    if (atomic_fetch_add(&b->arrived, 1) + 1 == size) {
        atomic_store(&b->arrived, 0);
        atomic_fetch_add(&b->generation, 1);
        futex(&b->generation, FUTEX_WAKE, INT_MAX);
        return;
    }
    while (atomic_load(&b->generation) == gen)
        futex(&b->generation, FUTEX_WAIT, gen);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double sink;

static void compute(long loops) {
    double x = 1.0;
    for (long i = 0; i < loops; i++)
        x = x * 1.0000001 + 1e-9;
    sink += x;
}

static long env_num(const char *name, long fallback) {
    const char *v = getenv(name);
    return v ? atol(v) : fallback;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: spmd ITERATIONS LOOPS_PER_ITERATION TAG\n");
        return 2;
    }
    long iterations = atol(argv[1]);
    long loops = atol(argv[2]);
    long rank = env_num("STORM_RANK", 0);
    uint32_t size = (uint32_t)env_num("STORM_SIZE", 1);
    const char *job = getenv("STORM_JOB_ID");
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/storm-bench-spmd-%s-%s", argv[3], job ? job : "solo");
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) {
        perror(path);
        return 1;
    }
    struct barrier *b = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    close(fd);
    barrier_wait(b, size);
    uint64_t start = now_ns();
    for (long i = 0; i < iterations; i++) {
        compute(loops);
        barrier_wait(b, size);
    }
    uint64_t end = now_ns();
    if (rank == 0) {
        unlink(path);
        printf("spmd %llu %llu\n", (unsigned long long)start, (unsigned long long)end);
    }
    return 0;
}
