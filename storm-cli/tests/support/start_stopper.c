/* A user stopping their own task starts before exec (storm-cli/tests/hostile_user.rs).
 *
 * Runs as a task of an unprivileged user, so its parent is the node's launcher. Process ids
 * are given out in order, so the next task the launcher starts gets one just above
 * /proc/sys/kernel/ns_last_pid. It sends SIGSTOP to those ids as fast as it can: the signal is
 * refused while the new process is still root's, and lands the moment it takes the user's
 * identity, before its exec. A stopped process that is not a child of the launcher (a
 * storm-submit of the same user, say) is continued at once.
 *
 * It keeps stopped only the processes it caught before their exec (still named after the
 * launcher); one caught after is continued at once, as stopping it holds nothing but itself.
 *
 * Signals go through a pidfd of each candidate. A process id read near ns_last_pid is as
 * often a new thread's id: kill() on a thread's id stops its whole process, and if that
 * thread has exited by the time of the SIGCONT, the kill() meant to continue the process
 * fails and it stays stopped (another test's storm-submit, in CI). pidfd_open refuses a
 * thread's id, and a pidfd names the same process for the stop and the continue.
 * Writes READY once running, and CAUGHT once it holds one; stops when STOP exists, continues
 * every process it stopped, and prints how many it held.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The parent of `pid` (and its state letter in `state`, if not NULL), or -1. */
static int stat_of(int pid, char *state_out) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return -1;
    char state;
    int ppid;
    if (sscanf(p + 2, "%c %d", &state, &ppid) != 2) return -1;
    if (state_out) *state_out = state;
    return ppid;
}

static int parent_of(int pid) { return stat_of(pid, NULL); }

/* A pidfd for the process `pid`, or -1 (gone, or the id of a thread, not a process). */
static int pidfd_of(int pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

/* Sends `sig` to the process behind `pidfd`: 0, or -1 as kill() would. */
static int signal_fd(int pidfd, int sig) {
    return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

/* Waits (briefly) until the SIGSTOP sent to `pid` has taken effect. A signal lands only on
 * the way back to user space: a process inside its exec is still named after the launcher
 * until the exec is done, and then stops as the task's program. Its name is read once it
 * has stopped, so a process caught inside its exec is not taken for one before it. */
static int wait_stopped(int pid) {
    for (int i = 0; i < 100000; i++) {
        char state = 0;
        if (stat_of(pid, &state) < 0) return 0;
        if (state == 'T' || state == 't') return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s READY CAUGHT STOP\n", argv[0]);
        return 2;
    }
    int launcher = getppid(), me = getpid();
    int stopped[4096], count = 0, others = 0;
    int fd = open(argv[1], O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    int last_fd = open("/proc/sys/kernel/ns_last_pid", O_RDONLY);
    time_t until = time(NULL) + 120;
    long rounds = 0;
    while (time(NULL) < until) {
        if ((++rounds & 0xffff) == 0 && access(argv[3], F_OK) == 0) break;
        char buf[32];
        int n = pread(last_fd, buf, sizeof buf - 1, 0);
        if (n <= 0) continue;
        buf[n] = 0;
        int last = atoi(buf);
        for (int pid = last - 1; pid <= last + 3; pid++) {
            if (pid <= 1 || pid == me) continue;
            int pidfd = pidfd_of(pid);
            if (pidfd < 0) continue;
            if (signal_fd(pidfd, SIGSTOP) != 0) {
                close(pidfd);
                continue;
            }
            if (parent_of(pid) != launcher) {
                signal_fd(pidfd, SIGCONT);
                close(pidfd);
                others++;
                continue;
            }
            /* Still the launcher's image (its name), or already the task's program? A task
             * caught after its exec is let go: stopping it holds nothing but itself. */
            char path[64], comm[32] = {0};
            snprintf(path, sizeof path, "/proc/%d/comm", pid);
            int cf = open(path, O_RDONLY);
            int early = 0;
            if (cf >= 0 && !wait_stopped(pid)) {
                close(cf);
                cf = -1;
            }
            if (cf >= 0) {
                early = read(cf, comm, sizeof comm - 1) > 0 && strncmp(comm, "storm-pl", 8) == 0;
                close(cf);
            }
            if (!early) {
                signal_fd(pidfd, SIGCONT);
                close(pidfd);
                continue;
            }
            close(pidfd);
            int seen = 0;
            for (int i = 0; i < count; i++) seen |= stopped[i] == pid;
            if (!seen && count < 4096) {
                stopped[count++] = pid;
                int caught = open(argv[2], O_CREAT | O_WRONLY, 0644);
                if (caught >= 0) close(caught);
            }
        }
    }
    for (int i = 0; i < count; i++) kill(stopped[i], SIGCONT);
    printf("stopped_before_exec=%d others=%d rounds=%ld\n", count, others, rounds);
    return 0;
}
