#include "core/status.h"

#include <stdarg.h>
#include <string.h>

static _Thread_local char g_msg[1024];
static _Thread_local char g_hint[512];

loom_status loom_fail(loom_status code, const char *hint, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    snprintf(g_hint, sizeof g_hint, "%s", hint ? hint : "");
    return code;
}

const char *loom_status_name(loom_status code) {
    switch (code) {
    case LOOM_OK: return "ok";
    case LOOM_EINVAL: return "invalid argument";
    case LOOM_EIO: return "i/o error";
    case LOOM_EFORMAT: return "malformed file";
    case LOOM_ENOMEM: return "out of memory";
    case LOOM_EUNSUPPORTED: return "unsupported";
    }
    return "unknown status";
}

const char *loom_error_message(void) { return g_msg; }
const char *loom_error_hint(void) { return g_hint; }
void loom_error_clear(void) { g_msg[0] = g_hint[0] = '\0'; }

void *loom_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "loom: error: out of memory allocating %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

void *loom_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "loom: error: out of memory allocating %zu x %zu bytes\n", count, size);
        exit(1);
    }
    return p;
}
