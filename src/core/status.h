// Status codes and error messages. Library functions return a loom_status; on failure they
// record one line saying what failed (with the offending value) and a hint, which the CLI
// prints as `loom: error: <message> (hint: <hint>)` before exiting non-zero.
#pragma once
#include <stdio.h>
#include <stdlib.h>

typedef enum {
    LOOM_OK = 0,
    LOOM_EINVAL,       // bad argument, flag value or configuration
    LOOM_EIO,          // file system error (missing path, unreadable, write failed)
    LOOM_EFORMAT,      // malformed file contents (magic, version, size, token range)
    LOOM_ENOMEM,       // allocation failed
    LOOM_EUNSUPPORTED, // valid request this build cannot do
} loom_status;

// Records the message (printf-style) and a hint for the calling thread; returns `code`.
// Usage: return loom_fail(LOOM_EFORMAT, "is it a token shard?", "%s: bad magic %d", path, m);
loom_status loom_fail(loom_status code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *loom_status_name(loom_status code);
const char *loom_error_message(void); // last message recorded by loom_fail on this thread
const char *loom_error_hint(void);    // its hint ("" when none)
void loom_error_clear(void);

// Propagate a failing status: LOOM_TRY(f(x));
#define LOOM_TRY(expr)                       \
    do {                                     \
        loom_status loom_try_s_ = (expr);    \
        if (loom_try_s_ != LOOM_OK)          \
            return loom_try_s_;              \
    } while (0)

// Internal invariants (programmer errors, not user input): print file:line and abort.
#define LOOM_CHECK(cond)                                                                \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "loom: internal check failed at %s:%d: %s\n", __FILE__,     \
                    __LINE__, #cond);                                                   \
            abort();                                                                    \
        }                                                                               \
    } while (0)

// malloc/calloc that abort on failure with the size asked for (for sizes loom controls).
void *loom_xmalloc(size_t bytes);
void *loom_xcalloc(size_t count, size_t size);
