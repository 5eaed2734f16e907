#include "runtime/launch.h"

#include "core/heartbeat.h"
#include "core/log.h"
#include "core/timer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal; // SIGINT or SIGTERM to the launcher
static volatile sig_atomic_t report_asked; // SIGUSR1: print where each rank is, and go on

static void on_signal(int sig) {
    if (sig == SIGUSR1)
        report_asked = 1;
    else
        stop_signal = sig;
}

typedef struct {
    pid_t pid;    // the command's process, the leader of the job's session
    double start; // loom_now() seconds at its start
    bool exited;  // the command has exited, with `status` (waitpid's)
    int status;
} job;

// Signals (sig > 0) or counts (sig 0) the live processes of session sid on this host: the command
// and everything it started that did not leave the session. Returns how many there are.
static int session_signal(pid_t sid, int sig) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int pid = atoi(e->d_name);
        char path[64], buf[512], state;
        int ppid, pgrp, session;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = pid > 0 ? fopen(path, "r") : NULL;
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *name_end = strrchr(buf, ')'); // "pid (name) state ppid pgrp session ...", a name may hold spaces
        if (!name_end || sscanf(name_end + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) != 4) continue;
        if (session != sid || state == 'Z') continue;
        n++;
        if (sig) kill(pid, sig);
    }
    closedir(d);
    return n;
}

// Reaps every exited child: the command, and the job's processes orphaned to the launcher (their
// subreaper); notes the command's status.
static void job_reap(job *j) {
    int status;
    for (pid_t p; (p = waitpid(-1, &status, WNOHANG)) > 0;)
        if (p == j->pid) j->exited = true, j->status = status;
}

// Starts argv in a session of its own. Errors: LOOM_EINVAL when it cannot be executed.
static loom_status job_start(job *j, char **argv) {
    int fds[2]; // the child's exec errno, when exec fails (the pipe closes on a successful exec)
    if (pipe2(fds, O_CLOEXEC) != 0) return loom_fail(LOOM_EIO, NULL, "cannot make a pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t launcher = getpid(), pid = fork();
    if (pid < 0) return loom_fail(LOOM_EIO, NULL, "cannot fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        setsid();
        prctl(PR_SET_PDEATHSIG, SIGTERM); // a launcher killed (even by SIGKILL) stops the job
        if (getppid() != launcher) _exit(127);
        execvp(argv[0], argv);
        int e = errno;
        if (write(fds[1], &e, sizeof e) < 0) _exit(126);
        _exit(127);
    }
    close(fds[1]);
    int e;
    ssize_t n;
    do n = read(fds[0], &e, sizeof e);
    while (n < 0 && errno == EINTR);
    close(fds[0]);
    *j = (job){.pid = pid, .start = loom_now()};
    if (n != sizeof e) return LOOM_OK;
    waitpid(pid, NULL, 0);
    return loom_fail(LOOM_EINVAL, "check the command's name, or give its path", "cannot run '%s': %s", argv[0],
                     strerror(e));
}

// Stops what is left of the job: SIGTERM to the command (mpirun stops its ranks), or to the
// session's processes once the command has gone; SIGKILL to the session after `grace` seconds;
// returns when none is left.
static void job_stop(job *j, double grace) {
    job_reap(j);
    if (!j->exited)
        kill(j->pid, SIGTERM);
    else
        session_signal(j->pid, SIGTERM);
    for (double t0 = loom_now(); loom_now() - t0 < grace; usleep(20000)) {
        job_reap(j);
        if (j->exited && session_signal(j->pid, 0) == 0) return;
    }
    for (;;) {
        job_reap(j);
        if (j->exited && session_signal(j->pid, SIGKILL) == 0) return;
        if (!j->exited) kill(j->pid, SIGKILL);
        usleep(20000);
    }
}

// Calls fn(path, ctx) for each heartbeat record file in dir.
static void each_record(const char *dir, void (*fn)(const char *path, void *ctx), void *ctx) {
    DIR *d = opendir(dir);
    if (!d) return;
    size_t prefix = strlen(LOOM_HEARTBEAT_PREFIX);
    for (struct dirent *e; (e = readdir(d));) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (strncmp(e->d_name, LOOM_HEARTBEAT_PREFIX, prefix) == 0) fn(path, ctx);
    }
    closedir(d);
}

typedef struct {
    loom_heartbeat *all;
    int n, cap;
} records;

static void read_record(const char *path, void *ctx) {
    records *r = ctx;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    loom_heartbeat h;
    bool ok = fd >= 0 && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == LOOM_HEARTBEAT_MAGIC;
    if (fd >= 0) close(fd);
    if (!ok) return;
    if (r->n == r->cap) r->all = realloc(r->all, (size_t)(r->cap = r->cap ? 2 * r->cap : 16) * sizeof *r->all);
    LOOM_CHECK(r->all);
    h.phase[15] = h.op[15] = '\0';
    r->all[r->n++] = h;
}

// The heartbeat records in dir, into a malloc'ed array of *n.
static loom_heartbeat *heartbeat_read(const char *dir, int *n) {
    records r = {0};
    each_record(dir, read_record, &r);
    *n = r.n;
    return r.all;
}

// The latest progress of any rank (loom_now() seconds), or `since` when none is later.
static double heartbeat_latest(const char *dir, double since) {
    int n;
    loom_heartbeat *all = heartbeat_read(dir, &n);
    for (int i = 0; i < n; i++)
        if (all[i].updated > since) since = all[i].updated;
    free(all);
    return since;
}

static int by_rank(const void *a, const void *b) {
    return ((const loom_heartbeat *)a)->rank - ((const loom_heartbeat *)b)->rank;
}

// Where each rank stopped, in rank order. Behind (what the others wait for): a rank at an
// earlier step than the latest, or at the latest with fewer collectives issued than the most there
// (ranks that issue the same collectives, as data-parallel replicas do, issue them in one order).
static void heartbeat_report(const char *dir, double now) {
    int n;
    loom_heartbeat *all = heartbeat_read(dir, &n);
    if (n == 0) fprintf(stderr, "loom launch:   no rank reached its heartbeat (stuck before or in MPI_Init)\n");
    qsort(all, (size_t)n, sizeof *all, by_rank);
    int64_t latest = 0;
    uint64_t most = 0;
    for (int i = 0; i < n; i++) latest = all[i].step > latest ? all[i].step : latest;
    for (int i = 0; i < n; i++)
        if (all[i].step == latest && all[i].collectives > most) most = all[i].collectives;
    for (int i = 0; i < n; i++) {
        const loom_heartbeat *h = &all[i];
        bool behind = h->step < latest || h->collectives < most;
        fprintf(stderr, "loom launch:   rank %d (pid %d): %s, step %lld, %llu collectives (last %s), quiet %.1f s%s\n",
                h->rank, h->pid, h->phase, (long long)h->step, (unsigned long long)h->collectives,
                h->op[0] ? h->op : "none", now - h->updated, behind ? "  <- behind: the others wait for it" : "");
    }
    free(all);
}

static void remove_record(const char *path, void *ctx) {
    (void)ctx;
    unlink(path);
}

// Empties dir of the last attempt's records.
static void heartbeat_clear(const char *dir) { each_record(dir, remove_record, NULL); }

// Waits until the command exits, a signal comes, or (hang_timeout > 0) no rank has made progress
// for hang_timeout seconds; true on a hang, after printing where the ranks stopped.
static bool job_watch(job *j, const loom_launch_options *o, const char *dir, int attempt) {
    while (!stop_signal) {
        job_reap(j);
        if (j->exited) return false;
        double now = loom_now();
        if (report_asked) {
            report_asked = 0;
            fprintf(stderr, "loom launch: attempt %d, %.1f s in (SIGUSR1); where each rank is:\n", attempt,
                    now - j->start);
            heartbeat_report(dir, now);
        }
        if (o->hang_timeout > 0 && now - heartbeat_latest(dir, j->start) > o->hang_timeout) {
            fprintf(stderr, "loom launch: attempt %d hung: no rank made progress for %g s (--hang-timeout); "
                            "where each rank stopped:\n", attempt, o->hang_timeout);
            heartbeat_report(dir, now);
            return true;
        }
        usleep(100000);
    }
    return false;
}

// How an attempt ended, into out: "hung for S s", "exit status N" or "killed by signal N (NAME)".
static void describe_end(char *out, size_t cap, const job *j, bool hung, const loom_launch_options *o) {
    if (hung)
        snprintf(out, cap, "hung for %g s", o->hang_timeout);
    else if (WIFSIGNALED(j->status))
        snprintf(out, cap, "killed by signal %d (%s)", WTERMSIG(j->status), strsignal(WTERMSIG(j->status)));
    else
        snprintf(out, cap, "exit status %d", WEXITSTATUS(j->status));
}

loom_status loom_launch_run(const loom_launch_options *o, char **argv) {
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/loom_launch_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(dir)) return loom_fail(LOOM_EIO, "set TMPDIR to a writable folder", "cannot make %s: %s", dir,
                                        strerror(errno));
    setenv("LOOM_HEARTBEAT_DIR", dir, 1);
    prctl(PR_SET_CHILD_SUBREAPER, 1); // the job's orphaned ranks are ours to wait for
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    loom_status s = LOOM_EIO;
    char end[128] = "";
    int attempt = 0;
    double t_all = loom_now();
    while (attempt <= o->max_restarts && !stop_signal) {
        attempt++;
        heartbeat_clear(dir);
        job j = {0};
        if ((s = job_start(&j, argv)) != LOOM_OK) break;
        s = LOOM_EIO;
        bool hung = job_watch(&j, o, dir, attempt);
        job_stop(&j, o->grace);
        if (stop_signal) break;
        if (!hung && WIFEXITED(j.status) && WEXITSTATUS(j.status) == 0) {
            fprintf(stderr, "loom launch: the job finished in %.1f s, attempt %d (%d restart%s)\n",
                    loom_now() - t_all, attempt, attempt - 1, loom_plural(attempt - 1));
            s = LOOM_OK;
            break;
        }
        describe_end(end, sizeof end, &j, hung, o);
        if (attempt <= o->max_restarts)
            fprintf(stderr, "loom launch: attempt %d ended after %.1f s: %s; restarting from the last checkpoint "
                            "(restart %d of %d)\n", attempt, loom_now() - j.start, end, attempt, o->max_restarts);
    }
    heartbeat_clear(dir);
    rmdir(dir);
    if (s != LOOM_EIO) return s; // finished, or could not be started
    if (stop_signal)
        return loom_fail(LOOM_EIO, "run the same command again to resume from the last checkpoint",
                         "loom launch was stopped by signal %d (%s), and stopped the job", (int)stop_signal,
                         strsignal(stop_signal));
    return loom_fail(LOOM_EIO, "the job's own lines above say why; raise --max-restarts if the failures are transient",
                     "the job ended without success %d time%s (last: %s)", attempt, loom_plural(attempt), end);
}
