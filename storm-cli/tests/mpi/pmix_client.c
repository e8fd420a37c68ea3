/* A PMIx client, as Open MPI 5 and programs written for `srun --mpi=pmix` are: it connects
 * to its node's PMIx server, reads the job's size and its own local rank, puts a key,
 * commits, fences with data collection, and reads its right-hand neighbour's key. With the
 * arguments `abort N`, rank 1 calls PMIx_Abort(N) after the fence instead; with `big N`,
 * every rank puts a second key of N bytes before the fence. With `dmodex`, the fence
 * collects no data (PMIx_Fence's default), and with `nofence` there is none: a neighbour's
 * key on another node then comes by direct modex. With `ends`, every rank listens for
 * PMIx events of a rank's end; after the fence the last rank finalizes and exits 7, and
 * each other rank prints what it heard (or that it heard nothing in 30 s). */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int heard = 0;
static char heard_text[160];

static void on_end(size_t id, pmix_status_t status, const pmix_proc_t *source,
                   pmix_info_t info[], size_t ninfo, pmix_info_t results[], size_t nresults,
                   pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata) {
    int code = -1;
    unsigned rank = source ? source->rank : 99999;
    (void)id; (void)results; (void)nresults;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_EXIT_CODE)) code = info[i].value.data.integer;
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC)) rank = info[i].value.data.proc->rank;
    }
    snprintf(heard_text, sizeof heard_text, "rank %u ended: event %d exit code %d", rank,
             (int)status, code);
    heard = 1;
    if (cbfunc) cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

int main(int argc, char **argv) {
    const char *mode = argc >= 2 ? argv[1] : "";
    pmix_proc_t me, wild, peer;
    pmix_value_t *val = NULL, v;
    pmix_info_t collect;
    bool yes = true;
    int rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init failed: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    PMIX_PROC_CONSTRUCT(&wild);
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    rc = PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &val);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "rank %u: no job size: %s\n", me.rank, PMIx_Error_string(rc));
        return 2;
    }
    uint32_t size = val->data.uint32;
    PMIX_VALUE_RELEASE(val);
    uint16_t lrank = 65535;
    if (PMIx_Get(&me, PMIX_LOCAL_RANK, NULL, 0, &val) == PMIX_SUCCESS) {
        lrank = val->data.uint16;
        PMIX_VALUE_RELEASE(val);
    }
    char mine[64];
    snprintf(mine, sizeof mine, "hello from %u", me.rank);
    PMIX_VALUE_LOAD(&v, mine, PMIX_STRING);
    PMIx_Put(PMIX_GLOBAL, "storm.test", &v);
    if (argc == 3 && strcmp(argv[1], "big") == 0) {
        size_t n = (size_t)atol(argv[2]);
        char *big = malloc(n + 1);
        memset(big, 'x', n);
        big[n] = 0;
        PMIX_VALUE_LOAD(&v, big, PMIX_STRING);
        PMIx_Put(PMIX_GLOBAL, "storm.big", &v);
    }
    if (strcmp(mode, "ends") == 0) {
        pmix_status_t codes[] = {PMIX_ERR_PROC_ABORTED_BY_SIG, PMIX_ERR_EXIT_NONZERO_TERM,
                                 PMIX_ERR_PROC_TERM_WO_SYNC};
        rc = PMIx_Register_event_handler(codes, 3, NULL, 0, on_end, NULL, NULL);
        if (rc < 0) {
            fprintf(stderr, "rank %u: no event handler: %s\n", me.rank, PMIx_Error_string(rc));
            return 5;
        }
    }
    PMIx_Commit();
    if (strcmp(mode, "nofence") != 0) {
        PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
        int collecting = strcmp(mode, "dmodex") != 0;
        rc = PMIx_Fence(NULL, 0, collecting ? &collect : NULL, collecting ? 1 : 0);
        if (rc != PMIX_SUCCESS) {
            fprintf(stderr, "rank %u: fence failed: %s\n", me.rank, PMIx_Error_string(rc));
            return 3;
        }
    }
    if (strcmp(mode, "ends") == 0) {
        if (me.rank == size - 1) {
            PMIx_Finalize(NULL, 0);
            return 7;
        }
        for (int i = 0; i < 3000 && !heard; i++) usleep(10000);
        printf("rank %u heard: %s\n", me.rank, heard ? heard_text : "nothing in 30 s");
        fflush(stdout);
        PMIx_Finalize(NULL, 0);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "abort") == 0 && me.rank == 1) {
        PMIx_Abort(atoi(argv[2]), "rank 1 gives up", NULL, 0);
        return 0;
    }
    PMIX_PROC_CONSTRUCT(&peer);
    PMIX_LOAD_PROCID(&peer, me.nspace, (me.rank + 1) % size);
    rc = PMIx_Get(&peer, "storm.test", NULL, 0, &val);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "rank %u: no key of rank %u: %s\n", me.rank, peer.rank, PMIx_Error_string(rc));
        return 4;
    }
    printf("rank %u of %u (local %u) got: %s\n", me.rank, size, lrank, val->data.string);
    PMIX_VALUE_RELEASE(val);
    PMIx_Finalize(NULL, 0);
    return 0;
}
