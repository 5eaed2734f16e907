#include "core/rng.h"

#include <math.h>

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void loom_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
    uint32_t k0 = key[0], k1 = key[1];
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(0xD2511F53u, c0, &hi0, &lo0);
        mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

static void block(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream,
                             (uint32_t)(stream >> 32)};
    loom_philox4x32(key, ctr, out);
}

static double u53(uint32_t a, uint32_t b) { // [0, 1)
    return (double)(((uint64_t)a << 21) ^ (b >> 11)) * 0x1p-53;
}

double loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    block(seed, stream, index, r);
    return u53(r[0], r[1]);
}

double loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t r[4];
    block(seed, stream, index, r);
    double u1 = 1.0 - u53(r[0], r[1]); // (0, 1]
    double u2 = u53(r[2], r[3]);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t loom_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n) {
    uint32_t r[4];
    block(seed, stream, index, r);
    uint64_t x = ((uint64_t)r[0] << 32) | r[1];
    // multiply-shift (Lemire); the bias is below 2^-64 * n, irrelevant for loom's n
    return (uint64_t)(((unsigned __int128)x * n) >> 64);
}
