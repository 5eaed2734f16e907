#include "cli/tensorboard.h"

#include "tensorboard.pb-c.h" // generated from src/cli/tensorboard.proto by protoc-c

#include <errno.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct cli_tensorboard {
    FILE *f;
    char path[4400];
};

uint32_t cli_tfrecord_masked_crc(const void *data, size_t n) {
    // CRC32C (Castagnoli): ISA-L's iSCSI CRC with the usual initial value and final inversion
    uint32_t crc = ~crc32_iscsi((unsigned char *)data, (int)n, 0xFFFFFFFFu);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static void put_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

// One TFRecord: the packed event framed by its length and the two masked CRCs.
static loom_status write_event(cli_tensorboard *tb, const Tensorboard__Event *ev) {
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *buf = loom_xmalloc(n + 16);
    put_le(buf, n, 8);
    put_le(buf + 8, cli_tfrecord_masked_crc(buf, 8), 4);
    tensorboard__event__pack(ev, buf + 12);
    put_le(buf + 12 + n, cli_tfrecord_masked_crc(buf + 12, n), 4);
    int bad = fwrite(buf, 1, n + 16, tb->f) != n + 16 || fflush(tb->f) != 0;
    free(buf);
    if (bad)
        return loom_fail(LOOM_EIO, "check the disk behind --tensorboard", "cannot write TensorBoard events %s: %s",
                         tb->path, strerror(errno));
    return LOOM_OK;
}

loom_status cli_tensorboard_open(cli_tensorboard **out, const char *dir, int64_t resume_step) {
    *out = NULL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return loom_fail(LOOM_EIO, "check --tensorboard", "cannot create TensorBoard folder %s: %s", dir,
                         strerror(errno));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    cli_tensorboard *tb = loom_xcalloc(1, sizeof *tb);
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%010lld.%s.%d", dir, (long long)time(NULL), host,
             (int)getpid());
    if (!(tb->f = fopen(tb->path, "wb"))) {
        loom_status s = loom_fail(LOOM_EIO, "check --tensorboard: the folder must be writable",
                                  "cannot create TensorBoard event file %s: %s", tb->path, strerror(errno));
        free(tb);
        return s;
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    loom_status s = write_event(tb, &ev);
    Tensorboard__SessionLog start = TENSORBOARD__SESSION_LOG__INIT;
    start.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
    ev.step = resume_step + 1;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &start;
    if (s == LOOM_OK && resume_step > 0) s = write_event(tb, &ev);
    if (s != LOOM_OK) {
        fclose(tb->f);
        unlink(tb->path);
        free(tb);
        return s;
    }
    *out = tb;
    return LOOM_OK;
}

loom_status cli_tensorboard_scalars(cli_tensorboard *tb, int64_t step, const char *const *tags, const double *vals,
                                    int n) {
    Tensorboard__Summary__Value *values = loom_xmalloc((size_t)n * sizeof *values);
    Tensorboard__Summary__Value **list = loom_xmalloc((size_t)n * sizeof *list);
    for (int i = 0; i < n; i++) {
        values[i] = (Tensorboard__Summary__Value)TENSORBOARD__SUMMARY__VALUE__INIT;
        values[i].tag = (char *)tags[i];
        values[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        values[i].simple_value = (float)vals[i];
        list[i] = &values[i];
    }
    Tensorboard__Summary summary = TENSORBOARD__SUMMARY__INIT;
    summary.n_value = (size_t)n;
    summary.value = list;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &summary;
    loom_status s = write_event(tb, &ev);
    free(list);
    free(values);
    return s;
}

loom_status cli_tensorboard_close(cli_tensorboard *tb) {
    if (!tb) return LOOM_OK;
    loom_status s = fclose(tb->f) == 0 ? LOOM_OK
                                       : loom_fail(LOOM_EIO, "check the disk behind --tensorboard",
                                                   "cannot write TensorBoard events %s: %s", tb->path, strerror(errno));
    free(tb);
    return s;
}
