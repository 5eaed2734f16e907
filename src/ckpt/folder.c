// The checkpoint folder: its lock and the leftovers of interrupted saves; see folder.h.
#include "ckpt/folder.h"

#include "core/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct loom_ckpt_lock {
    int fd;
    bool made; // the run created the folder (removed again when it stays empty)
    char dir[4096], path[4200];
};

// "pid 123 on host since 2026-01-02 03:04:05" into the lock file. Errors: LOOM_EIO.
static loom_status write_holder(const loom_ckpt_lock *l) {
    char host[256] = "?", when[32], line[400];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&now, &tm));
    int len = snprintf(line, sizeof line, "pid %d on %s since %s\n", (int)getpid(), host, when);
    if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, line, (size_t)len, 0) != len)
        return loom_fail(LOOM_EIO, "is the disk full? --ckpt-dir must be writable", "cannot write the lock file %s: %s",
                         l->path, strerror(errno));
    return LOOM_OK;
}

// Another run holds the lock: the error, naming it from the lock file's line.
static loom_status held_by_other(const loom_ckpt_lock *l) {
    char who[400] = "";
    ssize_t k = pread(l->fd, who, sizeof who - 1, 0);
    who[k > 0 ? k : 0] = '\0';
    who[strcspn(who, "\n")] = '\0';
    return loom_fail(LOOM_EINVAL, "wait for that run to end, or give another --ckpt-dir",
                     "checkpoint folder %s is in use by another run (%s; lock file %s)", l->dir,
                     who[0] ? who : "holder unknown", l->path);
}

// Opens and locks the lock file: *done when this settles it (locked, or an error in s).
static loom_status try_lock(loom_ckpt_lock *l, bool *done) {
    *done = true;
    l->fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (l->fd < 0)
        return loom_fail(LOOM_EIO, "--ckpt-dir must be a writable folder", "cannot write in checkpoint folder %s: %s",
                         l->dir, strerror(errno));
    if (flock(l->fd, LOCK_EX | LOCK_NB) != 0)
        return errno == EWOULDBLOCK ? held_by_other(l)
                                    : loom_fail(LOOM_EIO, NULL, "cannot lock %s: %s", l->path, strerror(errno));
    // its previous holder removes the file as it ends: locked, it must still be the one at the path
    struct stat a, b;
    if (fstat(l->fd, &a) == 0 && stat(l->path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
        return write_holder(l);
    close(l->fd);
    l->fd = -1;
    *done = false;
    return LOOM_OK;
}

loom_status loom_ckpt_lock_take(const char *dir, loom_ckpt_lock **out) {
    *out = NULL;
    loom_ckpt_lock *l = loom_xcalloc(1, sizeof *l);
    l->fd = -1;
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    snprintf(l->path, sizeof l->path, "%s/loom.lock", dir);
    struct stat sb;
    loom_status s = LOOM_OK;
    l->made = mkdir(dir, 0755) == 0;
    if (!l->made && errno != EEXIST)
        s = loom_fail(LOOM_EIO, "check --ckpt-dir", "cannot create checkpoint folder %s: %s", dir, strerror(errno));
    else if (stat(dir, &sb) != 0)
        s = loom_fail(LOOM_EIO, "check --ckpt-dir", "cannot read checkpoint folder %s: %s", dir, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        s = loom_fail(LOOM_EIO, "check --ckpt-dir", "checkpoint folder %s is %s, not a folder", dir,
                      loom_file_kind(sb.st_mode));
    for (bool done = s != LOOM_OK; !done;) s = try_lock(l, &done);
    if (s != LOOM_OK) {
        if (l->fd >= 0) close(l->fd);
        if (l->made) rmdir(dir);
        free(l);
        return s;
    }
    *out = l;
    return LOOM_OK;
}

void loom_ckpt_lock_release(loom_ckpt_lock *l) {
    if (!l) return;
    unlink(l->path); // while still locked: a run waiting on this file finds it gone and retries
    close(l->fd);
    if (l->made) rmdir(l->dir); // only when empty: a run that failed before its first save
    free(l);
}

typedef enum { NAME_OTHER, NAME_MODEL, NAME_STATE, NAME_META } name_kind;

// A checkpoint file's kind and step from its name (ckpt/checkpoint.h's names), and whether it
// is a temporary of one (NAME.tmp.PID, core/fileio.h).
static name_kind parse_name(const char *name, int64_t *step, bool *tmp) {
    static const struct {
        const char *format;
        int length;
        name_kind kind;
    } forms[] = {{"model_%8lld.bin%n", 18, NAME_MODEL},
                 {"state_%8lld_%*5d.bin%n", 24, NAME_STATE},
                 {"ckpt_%8lld.json%n", 18, NAME_META}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        long long s;
        int n = 0;
        if (sscanf(name, forms[i].format, &s, &n) != 1 || n != forms[i].length) continue;
        const char *rest = name + n, *pid = rest + 5;
        *tmp = *rest != '\0';
        if (*tmp && (strncmp(rest, ".tmp.", 5) != 0 || !*pid || strspn(pid, "0123456789") != strlen(pid))) continue;
        *step = s;
        return forms[i].kind;
    }
    return NAME_OTHER;
}

loom_status loom_ckpt_clean(const char *dir, int *removed) {
    *removed = 0;
    DIR *d = opendir(dir);
    if (!d) return loom_fail(LOOM_EIO, "check --ckpt-dir", "cannot read checkpoint folder %s: %s", dir, strerror(errno));
    int64_t *complete = NULL, step; // the steps with metadata
    size_t n = 0, cap = 0;
    bool tmp;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (parse_name(e->d_name, &step, &tmp) != NAME_META || tmp) continue;
        if (n == cap) complete = realloc(complete, (cap = 2 * cap + 16) * sizeof *complete);
        LOOM_CHECK(complete);
        complete[n++] = step;
    }
    rewinddir(d);
    loom_status s = LOOM_OK;
    while (s == LOOM_OK && (e = readdir(d)) != NULL) {
        name_kind kind = parse_name(e->d_name, &step, &tmp);
        bool has_meta = false;
        for (size_t i = 0; i < n && !has_meta; i++) has_meta = complete[i] == step;
        if (kind == NAME_OTHER || (!tmp && (kind == NAME_META || has_meta))) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0)
            s = loom_fail(LOOM_EIO, "remove it by hand", "cannot remove %s, left by an interrupted save: %s", path,
                          strerror(errno));
        else
            (*removed)++;
    }
    closedir(d);
    free(complete);
    return s;
}
