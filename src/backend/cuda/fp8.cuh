// Device helpers of the FP8 casts, shared by fp8.cu's cast kernels, the LayerNorm that writes its
// output's FP8 copy itself (layernorm.cu) and the MLP's products that write the GELU output's and
// the fc layer's output-gradient copies in their epilogue (gemm_fp8.cu): what a cast converts from
// 8 bf16 (as they are, their GELU, or the GELU's backward), packing scaled values into FP8 bytes
// (round to nearest even, saturated at the format's largest finite), an 8x8 block of FP8 bytes
// transposed into the cols copy, and raising a slot's amax once a block.
#pragma once
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gelu.cuh"

#include <cuda_fp8.h>

#define FP8_VEC 8 // values a pack takes: a row's 16 bytes of bf16 (fp8.cu's casts: also a thread's rows)

// The 8 bf16 of v as fp32 in x; returns the larger of m and their largest |x| (NaN ignored)
__device__ __forceinline__ float unpack8(float *x, uint4 v, float m) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&v;
#pragma unroll
    for (int e = 0; e < FP8_VEC / 2; e++) {
        float2 f = __bfloat1622float2(h[e]);
        x[2 * e] = f.x, x[2 * e + 1] = f.y;
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
    return m;
}

// What a cast converts, from its bf16 source x: x as it is, gelu(x), or x gelu'(pre) (the GELU's
// backward of the output gradient x; pre, the GELU's input, read beside x)
enum fp8_op { FP8_AS_IS, FP8_GELU, FP8_DGELU };

// The 8 values that a cast converts from the 8 bf16 of v (and of p, pre's, for FP8_DGELU) in x;
// returns the larger of m and their largest |x| (NaN ignored)
template <int OP> __device__ __forceinline__ float convert8(float *x, uint4 v, uint4 p, float m) {
    if constexpr (OP == FP8_AS_IS) {
        return unpack8(x, v, m);
    } else {
        float q[FP8_VEC];
        unpack8(x, v, 0.0f);
        if constexpr (OP == FP8_DGELU) unpack8(q, p, 0.0f);
#pragma unroll
        for (int e = 0; e < FP8_VEC; e++) {
            x[e] = OP == FP8_GELU ? gelu_of(x[e]) : x[e] * gelu_grad(q[e]);
            m = fmaxf(m, fabsf(x[e]));
        }
        return m;
    }
}

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

// a b c d (4 rows of 4 bytes) transposed in place: a holds the first bytes of the four, and so on
__device__ __forceinline__ void transpose4x4(uint32_t &a, uint32_t &b, uint32_t &c, uint32_t &d) {
    uint32_t t0 = __byte_perm(a, b, 0x5140), t1 = __byte_perm(c, d, 0x5140); // a0 b0 a1 b1, c0 d0 c1 d1
    uint32_t t2 = __byte_perm(a, b, 0x7362), t3 = __byte_perm(c, d, 0x7362); // a2 b2 a3 b3, c2 d2 c3 d3
    a = __byte_perm(t0, t1, 0x5410), b = __byte_perm(t0, t1, 0x7632);
    c = __byte_perm(t2, t3, 0x5410), d = __byte_perm(t2, t3, 0x7632);
}

// An 8x8 block of FP8 bytes, row k's bytes 0-3 in lo[k] and 4-7 in hi[k], transposed in place:
// then column j's 8 bytes are lo[j], lo[4 + j] (j < 4) and hi[j - 4], hi[j] (j >= 4)
__device__ __forceinline__ void transpose8x8(uint32_t *lo, uint32_t *hi) {
    transpose4x4(lo[0], lo[1], lo[2], lo[3]); // lo[j]: column j of rows 0-3
    transpose4x4(lo[4], lo[5], lo[6], lo[7]); // lo[4 + j]: column j of rows 4-7
    transpose4x4(hi[0], hi[1], hi[2], hi[3]); // the same for columns 4-7
    transpose4x4(hi[4], hi[5], hi[6], hi[7]);
}

// The 8x8 block at (r, c) of an FP8 (R,K), whose row k's bytes 0-3 are lo[k] and 4-7 hi[k], into
// cols (K,R) at (c, r): transposed in registers, a column's 8 bytes in one store
__device__ __forceinline__ void store_cols(uint8_t *cols, uint32_t *lo, uint32_t *hi, int64_t r, int64_t c,
                                           int64_t R) {
    transpose8x8(lo, hi);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        *(uint2 *)(cols + (c + j) * R + r) = make_uint2(lo[j], lo[4 + j]);
        *(uint2 *)(cols + (c + 4 + j) * R + r) = make_uint2(hi[j], hi[4 + j]);
    }
}
