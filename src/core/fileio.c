#include "core/fileio.h"

#include "core/fault.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

loom_status loom_atomic_open(loom_atomic_file *af, const char *path) {
    snprintf(af->path, sizeof af->path, "%s", path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%d", path, (int)getpid());
    af->f = fopen(af->tmp, "wb");
    if (!af->f)
        return loom_fail(LOOM_EIO, "check that the folder exists and is writable",
                         "cannot create %s: %s", af->tmp, strerror(errno));
    return LOOM_OK;
}

loom_status loom_atomic_write(loom_atomic_file *af, const void *data, size_t bytes) {
    loom_fault_point("save-write");
    if (bytes && fwrite(data, 1, bytes, af->f) != bytes)
        return loom_fail(LOOM_EIO, "is the disk full?", "writing %s failed: %s", af->tmp,
                         strerror(errno));
    return LOOM_OK;
}

void loom_atomic_abort(loom_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    unlink(af->tmp);
}

loom_status loom_atomic_commit(loom_atomic_file *af) {
    int err = 0;
    if (fflush(af->f) != 0 || fsync(fileno(af->f)) != 0) err = errno;
    if (fclose(af->f) != 0 && !err) err = errno;
    af->f = NULL;
    if (!err && rename(af->tmp, af->path) != 0) err = errno;
    if (err) {
        unlink(af->tmp);
        return loom_fail(LOOM_EIO, "is the disk full?", "saving %s failed: %s", af->path,
                         strerror(err));
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", af->path);
    int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return LOOM_OK;
}

loom_status loom_atomic_save(const char *path, const void *const *parts, const size_t *bytes, int n) {
    loom_atomic_file af;
    LOOM_TRY(loom_atomic_open(&af, path));
    for (int i = 0; i < n; i++) {
        loom_status s = loom_atomic_write(&af, parts[i], bytes[i]);
        if (s != LOOM_OK) {
            loom_atomic_abort(&af);
            return s;
        }
    }
    return loom_atomic_commit(&af);
}

const char *loom_file_kind(unsigned mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    }
    return "not a regular file";
}

loom_status loom_open_regular(const char *path, const char *what, const char *hint, int *fd) {
    *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // O_NONBLOCK: a FIFO without a writer would block
    if (*fd < 0) return loom_fail(LOOM_EIO, hint, "cannot open %s %s: %s", what, path, strerror(errno));
    struct stat st;
    int err = fstat(*fd, &st) != 0 ? errno : 0;
    if (err || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        if (err) return loom_fail(LOOM_EIO, hint, "cannot open %s %s: %s", what, path, strerror(err));
        return loom_fail(LOOM_EIO, "give a regular file", "%s %s is %s, not a regular file", what, path,
                         loom_file_kind(st.st_mode));
    }
    fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK);
    return LOOM_OK;
}

loom_status loom_fopen_regular(const char *path, const char *what, const char *hint, FILE **f) {
    int fd;
    *f = NULL;
    LOOM_TRY(loom_open_regular(path, what, hint, &fd));
    if (!(*f = fdopen(fd, "rb"))) {
        close(fd);
        return loom_fail(LOOM_EIO, hint, "cannot open %s %s: %s", what, path, strerror(errno));
    }
    return LOOM_OK;
}

loom_status loom_read_file(const char *path, char **data, size_t *size) {
    *data = NULL;
    *size = 0;
    FILE *f;
    LOOM_TRY(loom_fopen_regular(path, "file", "check the path", &f));
    struct stat st;
    fstat(fileno(f), &st);
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        return loom_fail(LOOM_ENOMEM, NULL, "cannot allocate %lld bytes for %s",
                         (long long)st.st_size, path);
    }
    size_t got = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (got != (size_t)st.st_size) {
        free(buf);
        return loom_fail(LOOM_EIO, NULL, "short read on %s", path);
    }
    buf[got] = '\0';
    *data = buf;
    *size = got;
    return LOOM_OK;
}

bool loom_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
