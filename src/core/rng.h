// Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11). A value depends only on (seed, stream, index), never on the order
// of calls, so a tensor initialised element by element gets the same values under any sharding
// or thread count (DESIGN principle 2). Streams name the consumer: a parameter tensor's id,
// the sampler, the data shuffler.
#pragma once
#include <stdint.h>

// The raw generator: four 32-bit words for key (k0,k1) and counter (c0..c3).
void loom_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);

// Uniform in [0, 1) with 53-bit resolution, for element `index` of `stream`.
double loom_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
// Standard normal N(0, 1) (Box-Muller on one Philox block), for element `index` of `stream`.
double loom_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
// Uniform integer in [0, n) (n > 0), for element `index` of `stream`.
uint64_t loom_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n);

// Stream ids of loom's consumers other than parameter tensors (which use their table index).
enum { LOOM_STREAM_SAMPLER = 1 << 20, LOOM_STREAM_SHUFFLE = 2 << 20 };
