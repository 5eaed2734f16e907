// Core: Philox4x32-10 against the Random123 known-answer vectors, the statistics of the
// normal generator, atomic writes, tensor views, JSON numbers that read back exactly, an fp32
// value split into a bf16 and its low half (the split master weights) and joined again.
#include "harness.h"

#include "core/bf16.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"
#include "core/tensor.h"

#include <string.h>
#include <unistd.h>

static void test_philox_kat(void) {
    // Random123 kat_vectors: philox4x32_10
    struct { uint32_t ctr[4], key[2], out[4]; } kat[3] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        loom_philox4x32(kat[i].key, kat[i].ctr, out);
        for (int j = 0; j < 4; j++)
            T_ASSERT(out[j] == kat[i].out[j], "kat %d word %d: %08x != %08x", i, j, out[j],
                     kat[i].out[j]);
    }
}

static void test_normal_stats(void) {
    uint64_t seed = t_next();
    const int n = 200000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double z = loom_rng_normal(seed, 7, (uint64_t)i);
        s += z;
        s2 += z * z;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    T_ASSERT(fabs(mean) < 0.015, "mean %g", mean);
    T_ASSERT(fabs(var - 1.0) < 0.02, "variance %g", var);
    // order independence: element 12345 does not depend on what was drawn before
    T_ASSERT(loom_rng_normal(seed, 7, 12345) == loom_rng_normal(seed, 7, 12345), "repeat");
    T_ASSERT(loom_rng_normal(seed, 7, 12345) != loom_rng_normal(seed, 8, 12345), "streams differ");
    uint64_t counts[10] = {0};
    for (int i = 0; i < 100000; i++) counts[loom_rng_below(seed, 9, (uint64_t)i, 10)]++;
    for (int k = 0; k < 10; k++)
        T_ASSERT(counts[k] > 9500 && counts[k] < 10500, "bucket %d count %llu", k,
                 (unsigned long long)counts[k]);
}

static void test_atomic_write(void) {
    char dir[] = "/tmp/loom_core_XXXXXX";
    T_ASSERT(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256];
    snprintf(path, sizeof path, "%s/file.bin", dir);
    loom_atomic_file af;
    T_ASSERT(loom_atomic_open(&af, path) == LOOM_OK, "open");
    T_ASSERT(loom_atomic_write(&af, "old", 3) == LOOM_OK, "write");
    T_ASSERT(loom_atomic_commit(&af) == LOOM_OK, "commit");
    // an aborted second write leaves the first file intact and no temporary behind
    T_ASSERT(loom_atomic_open(&af, path) == LOOM_OK, "open 2");
    T_ASSERT(loom_atomic_write(&af, "new-data", 8) == LOOM_OK, "write 2");
    loom_atomic_abort(&af);
    char *data;
    size_t n;
    T_ASSERT(loom_read_file(path, &data, &n) == LOOM_OK && n == 3 && memcmp(data, "old", 3) == 0,
             "old contents kept");
    free(data);
    T_ASSERT(!loom_path_exists(af.tmp), "temporary removed");
    // a folder that does not exist is an error naming the path
    char bad[300];
    snprintf(bad, sizeof bad, "%s/nope/file.bin", dir);
    T_ASSERT(loom_atomic_open(&af, bad) == LOOM_EIO, "missing folder");
    T_ASSERT(strstr(loom_error_message(), "nope") != NULL, "message names path: %s",
             loom_error_message());
    unlink(path);
    rmdir(dir);
}

static void test_views(void) {
    float buf[2 * 3 * 4];
    loom_tensor t = LOOM_VIEW(buf, LOOM_F32, 2, 3, 4);
    T_ASSERT(t.ndim == 3 && loom_numel(&t) == 24 && loom_rows(&t) == 6 && loom_cols(&t) == 4,
             "shape");
    loom_tensor s = loom_index(&t, 1);
    T_ASSERT(s.ndim == 2 && s.data == buf + 12, "index");
    loom_tensor r = loom_row_slice(&t, 2, 5);
    T_ASSERT(r.shape[0] == 3 && r.shape[1] == 4 && r.data == buf + 8, "row slice");
}

// One number written by loom_json_number and read back by cJSON's parser: the same double.
static bool json_round_trip(double v) {
    cJSON *o = cJSON_CreateObject();
    loom_json_add_number(o, "v", v);
    char *text = cJSON_PrintUnformatted(o);
    cJSON *back = cJSON_Parse(text);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(back, "v");
    bool same = cJSON_IsNumber(it) && it->valuedouble == v;
    if (!same) fprintf(stderr, "%.17g written as %s\n", v, text);
    cJSON_Delete(back), cJSON_Delete(o), free(text);
    return same;
}

static void test_json_numbers(void) {
    // step times as the trainer measures them (differences of CLOCK_MONOTONIC seconds near a
    // day of uptime: about 30 significant bits), values over the whole exponent range, the
    // integers of checkpoint metadata up to 2^53
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        double t0 = 86400.0 + (double)(t_next() % 1000000000) * 1e-9;
        double t1 = t0 + 0.01 + (double)(t_next() % 100000000) * 1e-9;
        bad += !json_round_trip(t1 - t0);
        uint64_t bits = t_next();
        double x;
        memcpy(&x, &bits, sizeof x);
        if (isfinite(x)) bad += !json_round_trip(x);
    }
    T_ASSERT(bad == 0, "%d numbers read back as other doubles", bad);
    const double ints[] = {0, 1, -1, 2147483648.0, 999999999999999.0, 1e15 + 1, 0x1p53 - 1, 0x1p53};
    for (int i = 0; i < 8; i++) T_ASSERT(json_round_trip(ints[i]), "integer %.17g", ints[i]);
    // not finite: null, as cJSON writes them
    cJSON *o = cJSON_CreateObject();
    loom_json_add_number(o, "a", NAN);
    loom_json_add_number(o, "b", -INFINITY);
    char *text = cJSON_PrintUnformatted(o);
    T_ASSERT(strcmp(text, "{\"a\":null,\"b\":null}") == 0, "non-finite written as %s", text);
    cJSON_Delete(o), free(text);
}

// loom_split_*: every 32-bit pattern comes back from its halves; a finite value's high half is
// loom_f32_to_bf16's nearest bf16 but on a tie, where it is the one away from zero; a high half
// rounded otherwise takes the low half nearest the value (the edges of its reach past them).
static void test_split(void) {
    const uint32_t edges[] = {0, 0x80000000u, 0x3f7fffffu, 0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu,
                              0x00008000u, 0x7fc08000u, 0x7fff8000u, 0xffff8000u, 0xffffffffu, 0x7f800000u};
    int bad_join = 0, bad_high = 0, bad_near = 0;
    for (int i = 0; i < 1000000 + (int)(sizeof edges / sizeof edges[0]); i++) {
        uint32_t b = i < (int)(sizeof edges / sizeof edges[0]) ? edges[i] : (uint32_t)t_next();
        uint16_t hi = loom_split_high(b), lo = loom_split_low(b);
        bad_join += loom_split_join(hi, lo) != b;
        float f;
        memcpy(&f, &b, sizeof f);
        if (isfinite(f)) {
            uint16_t rne = loom_f32_to_bf16(f);
            bool tie = (b & 0xffffu) == 0x8000u;
            bad_high += hi != (tie ? (uint16_t)((b >> 16) + 1) : rne);
            // beside a ties-to-even high half: exact but on the tie it rounded down (1 ulp under)
            uint32_t back = loom_split_join(rne, loom_split_low_near(rne, b));
            bad_near += back != (tie && rne == (uint16_t)(b >> 16) ? b - 1 : b);
        }
    }
    T_ASSERT(bad_join == 0, "split: %d patterns do not join back", bad_join);
    T_ASSERT(bad_high == 0, "split: %d high halves are not the nearest bf16 (ties away from zero)", bad_high);
    T_ASSERT(bad_near == 0, "split: %d low halves beside a ties-to-even bf16 are not the nearest", bad_near);
    // a high half out of reach: the nearer end, 1/2 bf16 ulp below or just under 1/2 above it
    uint32_t b = 0x40490fdbu; // pi
    T_ASSERT(loom_split_join(0x4047, loom_split_low_near(0x4047, b)) == 0x40477fffu, "split: above the reach");
    T_ASSERT(loom_split_join(0x404b, loom_split_low_near(0x404b, b)) == 0x404a8000u, "split: below the reach");
}

int main(void) {
    t_seed();
    test_philox_kat();
    test_normal_stats();
    test_atomic_write();
    test_views();
    test_json_numbers();
    test_split();
    return t_done("core");
}
