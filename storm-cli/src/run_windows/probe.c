/* A CPU-bound rank that records when it actually ran (storm_cli::run_windows).
 *
 *   probe DIR CPU_SECONDS [GAP_US [CLOCK]]
 *
 * Spins reading CLOCK_MONOTONIC (one clock for every node of a testbed, which share a kernel;
 * CLOCK "realtime": CLOCK_REALTIME, for nodes that are hosts of their own, whose clocks agree
 * only as far as their time synchronization keeps them) until it has run CPU_SECONDS of wall time on a CPU. A gap of more than GAP_US (default 1000)
 * between two readings means it was off the CPU (stopped, or preempted): the gap ends a run
 * window. At the end it writes its windows to DIR/job-$STORM_JOB_ID.rank-$STORM_RANK, one
 * "START_NS END_NS" line each.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static clockid_t clock_id = CLOCK_MONOTONIC;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(clock_id, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR CPU_SECONDS [GAP_US [monotonic|realtime]]\n", argv[0]);
        return 2;
    }
    const char *job = getenv("STORM_JOB_ID"), *rank = getenv("STORM_RANK");
    if (!job || !rank) {
        fprintf(stderr, "probe: STORM_JOB_ID and STORM_RANK must be set (run it under storm)\n");
        return 2;
    }
    uint64_t want = (uint64_t)(atof(argv[2]) * 1e9);
    uint64_t gap = (argc > 3 ? (uint64_t)atoll(argv[3]) : 1000) * 1000;
    if (argc > 4 && argv[4][0] == 'r') clock_id = CLOCK_REALTIME;
    size_t cap = 1024, n = 0;
    uint64_t *w = malloc(cap * 2 * sizeof *w);
    if (!w) return 1;
    uint64_t start = now_ns(), last = start, ran = 0;
    for (;;) {
        uint64_t t = now_ns();
        if (t - last > gap) {
            if (n == cap) {
                cap *= 2;
                w = realloc(w, cap * 2 * sizeof *w);
                if (!w) return 1;
            }
            w[2 * n] = start;
            w[2 * n + 1] = last;
            n++;
            ran += last - start;
            start = t;
        }
        last = t;
        if (ran + (last - start) >= want) break;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/job-%s.rank-%s", argv[1], job, rank);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%llu %llu\n", (unsigned long long)w[2 * i], (unsigned long long)w[2 * i + 1]);
    fprintf(f, "%llu %llu\n", (unsigned long long)start, (unsigned long long)last);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        perror(path);
        return 1;
    }
    return 0;
}
