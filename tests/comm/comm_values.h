// The inputs and expected results that the collective tests of tests/comm share: small integers
// (exact in every dtype, so sums are exact) from a seed every rank agrees on, written and read
// in any dtype, and the reduction over ranks (LOOM_SUM, LOOM_AVG rounded as the backends round it,
// LOOM_MAX).
#pragma once
#include "harness.h"

#include "comm/comm.h"
#include "core/bf16.h"
#include "core/rng.h"

static uint64_t g_seed;

// element i of rank r's input for case k: an integer in [-40, 40]
static double value(int k, int r, size_t i) {
    return (double)loom_rng_below(g_seed, (uint64_t)(1000 * k + r), i, 81) - 40.0;
}

static void put(void *buf, loom_dtype dt, size_t i, double v) {
    switch (dt) {
    case LOOM_F32: ((float *)buf)[i] = (float)v; break;
    case LOOM_F64: ((double *)buf)[i] = v; break;
    case LOOM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_BF16: ((uint16_t *)buf)[i] = loom_f32_to_bf16((float)v); break;
    }
}

static double get(const void *buf, loom_dtype dt, size_t i) {
    switch (dt) {
    case LOOM_F32: return ((const float *)buf)[i];
    case LOOM_F64: return ((const double *)buf)[i];
    case LOOM_I32: return ((const int32_t *)buf)[i];
    case LOOM_BF16: return loom_bf16_to_f32(((const uint16_t *)buf)[i]);
    }
    return 0;
}

// the expected reduction of element i over all ranks, rounded as the backend's AVG rounds
static double reduced(int k, int size, size_t i, loom_dtype dt, loom_red_op op) {
    double sum = 0, max = value(k, 0, i);
    for (int r = 0; r < size; r++) sum += value(k, r, i), max = fmax(max, value(k, r, i));
    if (op == LOOM_SUM) return sum;
    if (op == LOOM_MAX) return max;
    switch (dt) {
    case LOOM_F32: return (float)sum / (float)size;
    case LOOM_BF16: return loom_bf16_to_f32(loom_f32_to_bf16((float)sum / (float)size));
    case LOOM_I32: return (double)((int32_t)sum / size);
    case LOOM_F64: return sum / size;
    }
    return 0;
}

// The seed of the run, rank 0's (printed there), on every rank of c.
static void agree_seed(loom_comm *c) {
    uint64_t seed = loom_comm_rank(c) == 0 ? t_seed() : 0;
    loom_broadcast(c, &seed, 1, LOOM_F64, 0, NULL); // 8 bytes, whatever their meaning
    g_seed = seed;
}
