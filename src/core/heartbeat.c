#include "core/heartbeat.h"

#include "core/timer.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static loom_heartbeat *hb; // this process's mapped record, NULL when off

void loom_heartbeat_open(int rank) {
    const char *dir = getenv("LOOM_HEARTBEAT_DIR");
    if (hb || !dir || !dir[0]) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/" LOOM_HEARTBEAT_PREFIX "%d", dir, rank);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, sizeof(loom_heartbeat)) == 0)
        p = mmap(NULL, sizeof(loom_heartbeat), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "loom: warning: no heartbeat for the launcher's watchdog: cannot map %s\n", path);
        return;
    }
    hb = p;
    hb->rank = rank, hb->pid = (int32_t)getpid();
    loom_heartbeat_phase("start", 0);
    __atomic_store_n(&hb->magic, LOOM_HEARTBEAT_MAGIC, __ATOMIC_RELEASE);
}

static void copy_name(char *dst, const char *src) {
    size_t n = strlen(src);
    if (n > 15) n = 15;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void loom_heartbeat_phase(const char *phase, int64_t step) {
    if (!hb) return;
    copy_name(hb->phase, phase);
    hb->step = step;
    double now = loom_now();
    __atomic_store(&hb->updated, &now, __ATOMIC_RELEASE);
}

void loom_heartbeat_collective(const char *op) {
    if (!hb) return;
    copy_name(hb->op, op);
    __atomic_fetch_add(&hb->collectives, 1, __ATOMIC_RELAXED);
    double now = loom_now();
    __atomic_store(&hb->updated, &now, __ATOMIC_RELEASE);
}
