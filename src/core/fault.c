#include "core/fault.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

void loom_fault_point(const char *point) {
    static long hits = 0;
    const char *spec = getenv("LOOM_FAULT");
    size_t len = strlen(point);
    if (!spec || strncmp(spec, point, len) != 0 || spec[len] != ':') return;
    if (++hits == strtol(spec + len + 1, NULL, 10)) raise(SIGKILL);
}
