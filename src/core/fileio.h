// Atomic file writes (DESIGN principle 5): data goes to "<path>.tmp.<pid>", is flushed and
// fsynced, then renamed over `path` and the folder fsynced. A crash at any point leaves either
// the old file or the new one, never a mix; the temporary is removed on failure.
#pragma once
#include "core/status.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4200];
} loom_atomic_file;

// Opens the temporary. Errors: LOOM_EIO (folder missing or not writable), naming the path.
loom_status loom_atomic_open(loom_atomic_file *af, const char *path);
// Writes bytes; errors: LOOM_EIO (disk full, ...). On error the caller calls loom_atomic_abort.
loom_status loom_atomic_write(loom_atomic_file *af, const void *data, size_t bytes);
// Flush, fsync, close, rename to the final path, fsync the folder. On failure the temporary
// is removed and the previous file (if any) stays. Errors: LOOM_EIO.
loom_status loom_atomic_commit(loom_atomic_file *af);
// Closes and removes the temporary (after a failed write).
void loom_atomic_abort(loom_atomic_file *af);
// The whole sequence for a file made of n parts (e.g. a header and a payload): open, write
// each part (one loom_atomic_write per part), commit; abort on any failure. Errors: LOOM_EIO.
loom_status loom_atomic_save(const char *path, const void *const *parts, const size_t *bytes, int n);

// Reads a whole file into a malloc'ed buffer (NUL-terminated for text use; *size excludes the
// NUL). Errors: LOOM_EIO naming the path (missing, unreadable, or not a regular file).
loom_status loom_read_file(const char *path, char **data, size_t *size);
// Opens `path` for reading if it is a regular file, without blocking on a FIFO; *fd is the
// open descriptor (blocking). `what` names the file in messages ("token shard"), `hint` is the
// hint when it cannot be opened. Errors: LOOM_EIO "cannot open <what> <path>: <reason>", or
// "<what> <path> is a directory (FIFO, socket, device), not a regular file".
loom_status loom_open_regular(const char *path, const char *what, const char *hint, int *fd);
// The same as a stdio stream ("rb").
loom_status loom_fopen_regular(const char *path, const char *what, const char *hint, FILE **f);
// What a stat mode is, in words: "a regular file", "a directory", "a FIFO (named pipe)", ...
const char *loom_file_kind(unsigned mode);
bool loom_path_exists(const char *path);
