#include "core/fault.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void loom_fault_point(const char *point) {
    static long hits = 0;
    const char *spec = getenv("LOOM_FAULT");
    size_t len = strlen(point);
    if (!spec || strncmp(spec, point, len) != 0 || spec[len] != ':') return;
    char *end;
    if (++hits != strtol(spec + len + 1, &end, 10)) return;
    if (strcmp(end, ":hang") == 0)
        for (;;) pause(); // until a signal ends it, as a rank stuck in a driver or a collective
    if (strcmp(end, ":parent") != 0) raise(SIGKILL);
    pid_t parent = getppid();
    if (parent <= 1 || kill(parent, SIGKILL) != 0) return;
    for (int i = 0; i < 1000 && getppid() == parent; i++) usleep(10000); // until it is gone (10 s at most)
}
