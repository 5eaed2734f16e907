// AdamW (Loshchilov & Hutter, ICLR'19) on one contiguous range, the update of
// torch.optim.AdamW exactly as the CPU reference writes it (backend.h gives the formula):
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p -= lr * ((m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p)
// in the same order with every operation rounded alone (no fused multiply-adds, which the compiler
// would otherwise place differently in each instantiation), so that it gives the CPU's bits.
// param/grad (n) be->dtype, m/v (n) fp32. With master weights (master.data != NULL, fp32) the
// update runs on the master copy and param receives it rounded to nearest (bf16); without, the
// update runs on param itself. Bias corrections are computed once on the host in fp64
// (loom_adamw_bias). With args.stochastic_rounding (bf16 with master weights) param is the master
// value rounded stochastically with hashed random bits (sr_bits) instead of to nearest. With
// args.master_low (bf16, no master tensor) the master weights are split (core/bf16.h): param holds
// each one's high half and master_low its low half, 4 bytes a parameter where master and param take
// 6, and 2 fewer moved a step (26 bytes a parameter: gradient 2, moments 16, halves 8). With
// args.scalars the kernel reads lr, t, grad_scale and the bias corrections from device memory
// when it runs (a recorded step), and returns at once where its skip is set; step_scalars fills
// in the clipping factor and the skip flag there, with the host's fp64 arithmetic.
#include "backend/cuda/vec.cuh"

#include <math.h>

#define ADAMW_THREADS 256

// 32 random bits for element i at step t: a SplitMix64 finalizer of the three words (Steele et
// al., "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014)
__device__ __forceinline__ uint32_t sr_bits(uint64_t seed, int64_t t, int64_t i) {
    uint64_t z = seed ^ ((uint64_t)t * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

// x rounded to bf16 stochastically: the low 16 bits of x plus 16 random bits carry into the
// kept half with probability (low bits) / 2^16, i.e. the fraction of the gap (finite x)
__device__ __forceinline__ __nv_bfloat16 bf16_stochastic(float x, uint32_t bits) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x); // inf, NaN
    u += bits & 0xffffu;
    return __ushort_as_bfloat16((unsigned short)(u >> 16));
}

// nv vectors of W elements (vec.cuh: W = 8 bf16 or 4 fp32 parameters a step, the fp32 moments
// and master weights in as many 16-byte loads; W = 1 where an address or n does not allow it).
// SPLIT (T bf16): the master weights are param's bits joined with a.master_low's.
template <typename T, int W, bool SPLIT>
__global__ void adamw_kernel(T *param, float *master, const T *grad, float *m, float *v, int64_t nv,
                             loom_adamw_args a, float bc1, float bc2) {
    cuda_pdl_begin();
    if (const loom_step_scalars *s = a.scalars) { // this step's values
        if (s->skip) return;
        a.lr = s->lr, a.grad_scale = s->grad_scale, a.t = s->t, bc1 = s->bc1, bc2 = s->bc2;
    }
    GRID_STRIDE(iv, nv) {
        int64_t i = iv * W;
        float g[W], mi[W], vi[W], p[W];
        T high[W];       // SPLIT: the master weights' high halves (the parameters)
        uint16_t low[W]; // and their low halves
        vload<T, W>(g, grad + i);
        vload<float, W>(mi, m + i);
        vload<float, W>(vi, v + i);
        if constexpr (SPLIT) {
            vload_raw<T, W>(high, param + i);
            vload_raw<uint16_t, W>(low, a.master_low + i);
#pragma unroll
            for (int k = 0; k < W; k++) p[k] = __uint_as_float(loom_split_join(__bfloat16_as_ushort(high[k]), low[k]));
        } else if (master) {
            vload<float, W>(p, master + i);
        } else {
            vload<T, W>(p, param + i);
        }
#pragma unroll
        for (int k = 0; k < W; k++) { // every product and sum rounded, as the CPU's C: the same bits
            float gk = __fmul_rn(g[k], a.grad_scale);
            mi[k] = __fadd_rn(__fmul_rn(a.beta1, mi[k]), __fmul_rn(1.0f - a.beta1, gk));
            vi[k] = __fadd_rn(__fmul_rn(a.beta2, vi[k]), __fmul_rn(__fmul_rn(1.0f - a.beta2, gk), gk));
            float u = __fdiv_rn(__fdiv_rn(mi[k], bc1), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi[k], bc2)), a.eps));
            p[k] = __fsub_rn(p[k], __fmul_rn(a.lr, __fadd_rn(u, __fmul_rn(a.weight_decay, p[k]))));
        }
        vstore<float, W>(m + i, mi);
        vstore<float, W>(v + i, vi);
        if constexpr (SPLIT) {
#pragma unroll
            for (int k = 0; k < W; k++) {
                uint32_t bits = __float_as_uint(p[k]);
                high[k] = __ushort_as_bfloat16(loom_split_high(bits));
                low[k] = loom_split_low(bits);
            }
            vstore_raw<uint16_t, W>(a.master_low + i, low);
            vstore_raw<T, W>(param + i, high);
        } else {
            if (master) vstore<float, W>(master + i, p);
            if (sizeof(T) == 2 && master && a.stochastic_rounding) { // bf16 values: vstore keeps them
#pragma unroll
                for (int k = 0; k < W; k++)
                    p[k] = __bfloat162float(bf16_stochastic(p[k], sr_bits(a.sr_seed, a.t, a.index0 + i + k)));
            }
            vstore<T, W>(param + i, p);
        }
    }
}

template <typename T, int W, bool SPLIT>
static void adamw_launch(loom_backend *be, void *param, float *master, const void *grad, float *m, float *v,
                         int64_t n, loom_adamw_args args, float bc1, float bc2) {
    cuda_launch(cuda_of(be)->stream, adamw_kernel<T, W, SPLIT>, cuda_blocks(n / W, ADAMW_THREADS), ADAMW_THREADS, 0,
                (T *)param, master, (const T *)grad, m, v, n / W, args, bc1, bc2);
}

extern "C" void cuda_adamw_update(loom_backend *be, loom_tensor param, loom_tensor master,
                                  loom_tensor grad, loom_tensor m, loom_tensor v,
                                  loom_adamw_args args) {
    bool bf = cuda_act(be, param);
    int64_t n = loom_numel(&param);
    LOOM_CHECK(cuda_act(be, grad) == bf && (args.scalars || args.t >= 1));
    LOOM_CHECK(loom_numel(&grad) == n && loom_numel(&m) == n && loom_numel(&v) == n);
    float *mp = master.data ? cuda_f32(master) : NULL;
    if (mp) LOOM_CHECK(loom_numel(&master) == n);
    LOOM_CHECK(!args.master_low || (bf && !mp && !args.stochastic_rounding));
    if (!n) return;
    float bc1 = args.scalars ? 0.0f : loom_adamw_bias(args.beta1, args.t),
          bc2 = args.scalars ? 0.0f : loom_adamw_bias(args.beta2, args.t);
    const void *state = args.master_low ? (const void *)args.master_low : mp;
    bool vec = cuda_vec_ok(bf, n, param.data, state, grad.data, m.data, v.data);
    float *mm = cuda_f32(m), *vv = cuda_f32(v);
    if (args.master_low && vec)
        adamw_launch<__nv_bfloat16, 8, true>(be, param.data, mp, grad.data, mm, vv, n, args, bc1, bc2);
    else if (args.master_low)
        adamw_launch<__nv_bfloat16, 1, true>(be, param.data, mp, grad.data, mm, vv, n, args, bc1, bc2);
    else
        CUDA_DISPATCH(bf, vec, adamw_launch<T, W, false>(be, param.data, mp, grad.data, mm, vv, n, args, bc1, bc2));
}

// The device's part of sc (backend.h's step_scalars): one block; every thread checks its share
// of the losses, thread 0 the norm, and derives the clipping factor as the host does.
__global__ void step_scalars_kernel(loom_step_scalars *sc, const float *losses, int64_t n, float max_norm) {
    cuda_pdl_begin();
    bool finite = true;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) finite = finite && isfinite(losses[i]);
    finite = __syncthreads_and(finite);
    if (threadIdx.x != 0) return;
    double norm = sqrt(sc->sumsq);
    sc->skip = !finite || !isfinite(norm);
    sc->grad_scale = loom_clip_scale(norm, max_norm);
}

extern "C" void cuda_step_scalars(loom_backend *be, loom_step_scalars *sc, loom_tensor losses, float max_norm) {
    cuda_launch(cuda_of(be)->stream, step_scalars_kernel, 1, ADAMW_THREADS, 0, sc, cuda_f32(losses),
                loom_numel(&losses), max_norm);
}
