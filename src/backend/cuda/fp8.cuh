// Device helpers of the FP8 casts, shared by fp8.cu's cast kernels and the LayerNorm that writes
// its output's FP8 copy itself (layernorm.cu): packing scaled values into FP8 bytes (round to
// nearest even, saturated at the format's largest finite) and raising a slot's amax once a block.
#pragma once
#include "backend/cuda/cuda_ops.h"

#include <cuda_fp8.h>

#define FP8_VEC 8 // values a pack takes: a row's 16 bytes of bf16 (fp8.cu's casts: also a thread's rows)

// FP8_VEC floats times s as FP8_VEC FP8 bytes (element 0 in the lowest byte)
__device__ __forceinline__ uint2 fp8_pack(const float *x, float s, __nv_fp8_interpretation_t fmt) {
    uint32_t w[2];
    for (int h = 0; h < FP8_VEC / 4; h++) {
        uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x[4 * h] * s, x[4 * h + 1] * s), __NV_SATFINITE, fmt);
        uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x[4 * h + 2] * s, x[4 * h + 3] * s), __NV_SATFINITE, fmt);
        w[h] = lo | hi << 16;
    }
    return make_uint2(w[0], w[1]);
}

// *record raised to the largest m of the block's threads (fp32 bits), one atomic a block; every
// thread of the block (THREADS) calls it
template <int THREADS> __device__ __forceinline__ void record_max(float m, unsigned *record) {
    __shared__ float warps[THREADS / 32];
    m = warp_max(m);
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < THREADS / 32; w++) m = fmaxf(m, warps[w]);
    atomicMax(record, __float_as_uint(m));
}
