// 16-byte vector access for the memory-bound kernels: W elements of T (8 bf16 or 4 fp32) per
// load or store, converted to and from fp32 registers. A kernel is instantiated for (T, W) with
// W = 16 / sizeof(T) when every pointer it touches is 16-byte aligned and its row length (or
// element count) is a multiple of W, and with W = 1 otherwise; CUDA_DISPATCH picks the
// instantiation once per launch. Wide loads matter on Hopper: a warp of scalar bf16 loads moves
// 64 bytes per instruction and leaves the load units, not memory, the limit.
#pragma once
#include "backend/cuda/cuda_ops.h"

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// x[0..W) = p[0..W) as fp32; p 16-byte aligned when W * sizeof(T) is a multiple of 16 (then
// read as W * sizeof(T) / 16 16-byte loads)
template <typename T, int W> __device__ __forceinline__ void vload(float (&x)[W], const T *p) {
    if constexpr (W * sizeof(T) % 16 == 0) {
        constexpr int PER = 16 / sizeof(T);
#pragma unroll
        for (int q = 0; q < W / PER; q++) {
            uint4 u = reinterpret_cast<const uint4 *>(p)[q];
            const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
            for (int k = 0; k < PER; k++) x[q * PER + k] = to_f32(e[k]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < W; k++) x[k] = to_f32(p[k]);
    }
}

// x[0..W) = p[0..W) as stored (to_f32 converts each when it is used: a bf16 load in flight then
// holds half the registers); alignment as vload
template <typename T, int W> __device__ __forceinline__ void vload_raw(T (&x)[W], const T *p) {
    if constexpr (W * sizeof(T) % 16 == 0) {
#pragma unroll
        for (int q = 0; q < W * (int)sizeof(T) / 16; q++)
            reinterpret_cast<uint4 *>(x)[q] = reinterpret_cast<const uint4 *>(p)[q];
    } else {
#pragma unroll
        for (int k = 0; k < W; k++) x[k] = p[k];
    }
}

// p[0..W) = x[0..W) as they are; alignment as vload
template <typename T, int W> __device__ __forceinline__ void vstore_raw(T *p, const T (&x)[W]) {
    if constexpr (W * sizeof(T) % 16 == 0) {
#pragma unroll
        for (int q = 0; q < W * (int)sizeof(T) / 16; q++)
            reinterpret_cast<uint4 *>(p)[q] = reinterpret_cast<const uint4 *>(x)[q];
    } else {
#pragma unroll
        for (int k = 0; k < W; k++) p[k] = x[k];
    }
}

// p[0..W) = x[0..W) rounded to T (nearest even for bf16); alignment as vload
template <typename T, int W> __device__ __forceinline__ void vstore(T *p, const float (&x)[W]) {
    if constexpr (W * sizeof(T) % 16 == 0) {
        constexpr int PER = 16 / sizeof(T);
#pragma unroll
        for (int q = 0; q < W / PER; q++) {
            uint4 u;
            T *e = reinterpret_cast<T *>(&u);
#pragma unroll
            for (int k = 0; k < PER; k++) e[k] = from_f32<T>(x[q * PER + k]);
            reinterpret_cast<uint4 *>(p)[q] = u;
        }
    } else {
#pragma unroll
        for (int k = 0; k < W; k++) p[k] = from_f32<T>(x[k]);
    }
}

// Whether a launch may use 16-byte vectors: `count` (a row length or element count) divides
// by the vector width of the dtype, and every pointer (NULL ends the list) is 16-byte aligned.
static inline bool cuda_vec_ok(bool bf, int64_t count, const void *p0, const void *p1 = NULL,
                               const void *p2 = NULL, const void *p3 = NULL, const void *p4 = NULL) {
    if (count % (bf ? 8 : 4)) return false;
    const void *ps[] = {p0, p1, p2, p3, p4};
    for (const void *p : ps)
        if (p && (uintptr_t)p % 16) return false;
    return true;
}

// Runs the statement list with T (the storage type) and W (elements per access) bound for
// dtype bf (bf16 or fp32) and vector access `vec` (from cuda_vec_ok).
#define CUDA_DISPATCH(bf, vec, ...)                                                        \
    do {                                                                                   \
        if (bf) {                                                                          \
            using T = __nv_bfloat16;                                                       \
            if (vec) {                                                                     \
                constexpr int W = 8;                                                       \
                __VA_ARGS__;                                                               \
            } else {                                                                       \
                constexpr int W = 1;                                                       \
                __VA_ARGS__;                                                               \
            }                                                                              \
        } else {                                                                           \
            using T = float;                                                               \
            if (vec) {                                                                     \
                constexpr int W = 4;                                                       \
                __VA_ARGS__;                                                               \
            } else {                                                                       \
                constexpr int W = 1;                                                       \
                __VA_ARGS__;                                                               \
            }                                                                              \
        }                                                                                  \
    } while (0)
