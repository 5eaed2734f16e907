// Token + position embedding (GPT-2's wte and wpe), as llm.c's encoder_forward/backward, over
// one range of the vocabulary: wte holds rows [vocab_start, vocab_start + Vl) (backend.h).
//   forward:  out[b,t,:] = wte[tok - vocab_start,:] + wpe[t,:] for a token of this shard, else 0
//   backward: dwte[v,:] += sum of dout[b,t,:] over (b,t) with tokens[b,t] = vocab_start + v;
//             dwpe[t,:] += sum_b dout[b,t,:] (over every token)
// The dwte scatter is deterministic without atomics, as llm.c's is, but grouped on the device
// (so the op never waits for the stream, and a CUDA graph can hold it): a stable radix sort of
// (shard row, position) pairs (CUB) puts each token's positions together in increasing order, a
// run-length encoding and a scan give each distinct token its group, and one block per group
// sums the group's rows in that order. dwpe sums over b in order per (t, c).
// A negative token (which the data loader rules out) yields NaN rows in the forward; it and a
// token past this shard's range (another shard's) add nothing to dwte.
#include "backend/cuda/vec.cuh"

#include <cub/cub.cuh>
#include <math.h>

#define ENC_THREADS 256
#define ENC_ROWS 8 // rows (warps) per encoder_forward block

// out[bt, :] = wte[v, :] + wpe[t, :] for row bt = b T + t, one warp a row, in vectors of W (the
// element-wise form spent its time dividing each element's 64-bit index by C: 60 us at gpt2's
// B=16, bound by its issue slots; ncu, H200)
template <typename Tv, int W>
__global__ void encoder_forward_kernel(Tv *out, const int32_t *tokens, const Tv *wte, const Tv *wpe, int64_t BT,
                                       int T, int C, int vocab_start, int Vl) {
    cuda_pdl_begin();
    int64_t bt = (int64_t)blockIdx.x * ENC_ROWS + threadIdx.x / 32;
    if (bt >= BT) return;
    int t = (int)(bt % T), tok = tokens[bt], v = cuda_shard_index(tok, vocab_start, Vl);
    for (int c = threadIdx.x % 32 * W; c < C; c += 32 * W) {
        float x[W], y[W];
        if (v >= 0) {
            vload<Tv, W>(x, wte + (int64_t)v * C + c);
            vload<Tv, W>(y, wpe + (int64_t)t * C + c);
#pragma unroll
            for (int k = 0; k < W; k++) x[k] += y[k];
        } else {
#pragma unroll
            for (int k = 0; k < W; k++) x[k] = tok < 0 ? NAN : 0.0f;
        }
        vstore<Tv, W>(out + bt * C + c, x);
    }
}

// keys[i] = the shard row of tokens[i], or Vl (sorted last, added nowhere) for another shard's
// token or a negative one; vals[i] = i
__global__ void encoder_keys_kernel(uint32_t *keys, int32_t *vals, const int32_t *tokens, int n, int vocab_start,
                                    int Vl) {
    cuda_pdl_begin();
    GRID_STRIDE(i, n) {
        int v = cuda_shard_index(tokens[i], vocab_start, Vl);
        keys[i] = (uint32_t)(v >= 0 ? v : Vl);
        vals[i] = (int32_t)i;
    }
}

// block u < *nruns: dwte[uniq[u], :] += sum over k in [offsets[u], offsets[u] + counts[u]) of
// dout[pos[k], :], in order of k (uniq[u] = Vl: not this shard's)
__global__ void encoder_backward_wte_kernel(void *dwte, const void *dout, const int32_t *pos, const int32_t *offsets,
                                            const int32_t *counts, const uint32_t *uniq, const int32_t *nruns, int Vl,
                                            int C, bool bf) {
    cuda_pdl_begin();
    int u = blockIdx.x;
    if (u >= *nruns || uniq[u] == (uint32_t)Vl) return;
    int k0 = offsets[u], k1 = k0 + counts[u];
    int64_t row = (int64_t)uniq[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int k = k0; k < k1; k++) s += ldx(dout, (int64_t)pos[k] * C + c, bf);
        stx(dwte, row + c, ldx(dwte, row + c, bf) + s, bf);
    }
}

// dwpe[t, c] += sum over b in order of dout[b, t, c]
__global__ void encoder_backward_wpe_kernel(void *dwpe, const void *dout, int B, int T, int C,
                                            bool bf) {
    cuda_pdl_begin();
    GRID_STRIDE(i, (int64_t)T * C) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += ldx(dout, (int64_t)b * T * C + i, bf);
        stx(dwpe, i, ldx(dwpe, i, bf) + s, bf);
    }
}

extern "C" void cuda_encoder_forward(loom_backend *be, loom_tensor out, loom_tensor tokens,
                                     loom_tensor wte, loom_tensor wpe, int vocab_start) {
    bool bf = cuda_act(be, wte);
    LOOM_CHECK(tokens.ndim == 2 && cuda_act(be, out) == bf && cuda_act(be, wpe) == bf && vocab_start >= 0);
    int64_t B = tokens.shape[0], Tn = tokens.shape[1], C = loom_cols(&wte); // Tn: T is the dispatch's type
    LOOM_CHECK(loom_numel(&out) == B * Tn * C && loom_cols(&wpe) == C && Tn <= loom_rows(&wpe));
    if (B * Tn * C == 0) return;
    CUDA_DISPATCH(bf, cuda_vec_ok(bf, C, out.data, wte.data, wpe.data), {
        cuda_launch(cuda_of(be)->stream, encoder_forward_kernel<T, W>, (unsigned)((B * Tn + ENC_ROWS - 1) / ENC_ROWS),
                    32 * ENC_ROWS, 0, (T *)out.data, cuda_i32(tokens), (const T *)wte.data, (const T *)wpe.data, B * Tn,
                    (int)Tn, (int)C, vocab_start, (int)loom_rows(&wte));
    });
}

// The n-element arrays of the grouping and CUB's temporary storage, carved out of the scratch
// buffer at 256-byte boundaries.
typedef struct {
    uint32_t *keys, *sorted_keys, *uniq; // shard rows (Vl: none)
    int32_t *vals, *pos, *counts, *offsets, *nruns;
    void *temp;
    size_t temp_bytes;
} enc_groups;

static enc_groups enc_groups_of(loom_cuda *cu, int n, int end_bit) {
    enc_groups g = {};
    size_t sort_b = 0, rle_b = 0, scan_b = 0, arr = cuda_align256((size_t)n * sizeof(int32_t));
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, sort_b, g.keys, g.sorted_keys, g.vals, g.pos, n, 0, end_bit));
    CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(NULL, rle_b, g.sorted_keys, g.uniq, g.counts, g.nruns, n));
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(NULL, scan_b, g.counts, g.offsets, n));
    g.temp_bytes = sort_b > rle_b ? sort_b : rle_b;
    g.temp_bytes = cuda_align256(g.temp_bytes > scan_b ? g.temp_bytes : scan_b);
    char *p = (char *)cuda_scratch(cu, 7 * arr + 256 + g.temp_bytes);
    void **arrays[] = {(void **)&g.keys, (void **)&g.vals, (void **)&g.sorted_keys, (void **)&g.pos,
                       (void **)&g.uniq, (void **)&g.counts, (void **)&g.offsets};
    for (int k = 0; k < 7; k++) *arrays[k] = p + k * arr;
    g.nruns = (int32_t *)(p + 7 * arr);
    g.temp = p + 7 * arr + 256;
    return g;
}

extern "C" void cuda_encoder_backward(loom_backend *be, loom_tensor dwte, loom_tensor dwpe,
                                      loom_tensor dout, loom_tensor tokens, int vocab_start) {
    loom_cuda *cu = cuda_of(be);
    bool bf = cuda_act(be, dwte);
    LOOM_CHECK(tokens.ndim == 2 && cuda_act(be, dwpe) == bf && cuda_act(be, dout) == bf && vocab_start >= 0);
    int64_t B = tokens.shape[0], T = tokens.shape[1], C = loom_cols(&dwte), Vl = loom_rows(&dwte);
    LOOM_CHECK(loom_numel(&dout) == B * T * C && loom_cols(&dwpe) == C && T <= loom_rows(&dwpe));
    int n = (int)(B * T), end_bit = 1;
    if (!n || !C) return;
    while ((1LL << end_bit) <= Vl) end_bit++; // keys lie in [0, Vl]
    enc_groups g = enc_groups_of(cu, n, end_bit);
    cuda_launch(cu->stream, encoder_keys_kernel, cuda_blocks(n, ENC_THREADS), ENC_THREADS, 0, g.keys, g.vals,
                cuda_i32(tokens), n, vocab_start, (int)Vl);
    size_t tb = g.temp_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(g.temp, tb, g.keys, g.sorted_keys, g.vals, g.pos, n, 0, end_bit,
                                               cu->stream));
    tb = g.temp_bytes;
    CUDA_CHECK(cudaMemsetAsync(g.counts, 0, (size_t)n * sizeof(int32_t), cu->stream)); // past *nruns: 0
    CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(g.temp, tb, g.sorted_keys, g.uniq, g.counts, g.nruns, n, cu->stream));
    tb = g.temp_bytes;
    CUDA_CHECK(cub::DeviceScan::ExclusiveSum(g.temp, tb, g.counts, g.offsets, n, cu->stream));
    cuda_launch(cu->stream, encoder_backward_wte_kernel, (unsigned)n, ENC_THREADS, 0, dwte.data, dout.data, g.pos,
                g.offsets, g.counts, g.uniq, g.nruns, (int)Vl, (int)C, bf);
    cuda_launch(cu->stream, encoder_backward_wpe_kernel, cuda_blocks(T * C, ENC_THREADS), ENC_THREADS, 0, dwpe.data,
                dout.data, (int)B, (int)T, (int)C, bf);
}
