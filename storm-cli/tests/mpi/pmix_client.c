/* A PMIx client, as Open MPI 5 and programs written for `srun --mpi=pmix` are: it connects
 * to its node's PMIx server, reads the job's size and its own local rank, puts a key,
 * commits, fences with data collection, and reads its right-hand neighbour's key. With the
 * arguments `abort N`, rank 1 calls PMIx_Abort(N) after the fence instead; with `big N`,
 * every rank puts a second key of N bytes before the fence. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
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
    PMIx_Commit();
    PMIX_INFO_LOAD(&collect, PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    rc = PMIx_Fence(NULL, 0, &collect, 1);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "rank %u: fence failed: %s\n", me.rank, PMIx_Error_string(rc));
        return 3;
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
