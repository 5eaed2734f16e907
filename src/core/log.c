#include "core/log.h"

#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

static int g_rank = 0, g_world = 1;

void loom_log_set_rank(int rank, int world_size) {
    g_rank = rank;
    g_world = world_size;
}

int loom_log_rank(void) { return g_rank; }

void loom_info(const char *fmt, ...) {
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void loom_warn(const char *fmt, ...) {
    if (g_world > 1) fprintf(stderr, "[rank %d] ", g_rank);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

void loom_print_error(void) {
    const char *hint = loom_error_hint();
    if (g_world > 1) fprintf(stderr, "[rank %d] ", g_rank);
    if (hint[0])
        fprintf(stderr, "loom: error: %s (hint: %s)\n", loom_error_message(), hint);
    else
        fprintf(stderr, "loom: error: %s\n", loom_error_message());
}

void loom_format_bytes(char *out, size_t cap, double bytes, int gib_decimals) {
    const double gib = 1024.0 * 1024 * 1024;
    if (bytes >= gib) snprintf(out, cap, "%.*f GiB", gib_decimals, bytes / gib);
    else snprintf(out, cap, "%.1f MiB", bytes / (1024.0 * 1024));
}
