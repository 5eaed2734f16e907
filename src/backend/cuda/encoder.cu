// Token + position embedding (GPT-2's wte and wpe), as llm.c's encoder_forward/backward, over
// one range of the vocabulary: wte holds rows [vocab_start, vocab_start + Vl) (backend.h).
//   forward:  out[b,t,:] = wte[tok - vocab_start,:] + wpe[t,:] for a token of this shard, else 0
//   backward: dwte[v,:] += sum of dout[b,t,:] over (b,t) with tokens[b,t] = vocab_start + v;
//             dwpe[t,:] += sum_b dout[b,t,:] (over every token)
// The dwte scatter is deterministic without atomics, as llm.c's is, but grouped on the device
// (so the op never waits for the stream, and a CUDA graph can hold it): a stable radix sort of
// (shard row, position) pairs (CUB) puts each token's positions together in increasing order.
// The sorted tokens are then cut into fixed chunks of ENC_CHUNK, a warp each, which sums its
// chunk's rows of dout run by run (a run: one token's positions): a run that lies in the chunk is
// added to its dwte row there, and the pieces of a run that crosses chunks are added in chunk
// order by a second pass. The order depends only on the tokens, so dwte repeats bit for bit; no
// warp takes more than ENC_CHUNK rows, however often a token occurs. (The form before, a block
// a distinct token, waited on the most frequent tokens' rows one by one: on Brown text at gpt2's
// B=16 the backward took 356 us a step, now 79; on random tokens 134, now 79; ncu, H200.) dwpe
// sums over b in order per (t, c).
// A negative token (which the data loader rules out) yields NaN rows in the forward; it and a
// token past this shard's range (another shard's) add nothing to dwte.
#include "backend/cuda/vec.cuh"

#include <cub/cub.cuh>
#include <math.h>

#define ENC_THREADS 256
#define ENC_ROWS 8   // rows (warps) per encoder_forward block
#define ENC_CHUNK 16 // sorted tokens a warp of the dwte passes takes
#define ENC_LOADS 8  // rows (pass 1) or pieces (pass 2) a lane loads before it adds them, in order
#define ENC_WARPS 8  // warps a block of the dwte passes

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

// The chunk a warp of the dwte passes takes: tokens [k0, k0 + len) of the sorted n
struct enc_chunk {
    int64_t j, k0;
    int len;
};
__device__ __forceinline__ enc_chunk enc_chunk_of(int n) {
    int64_t j = (int64_t)blockIdx.x * ENC_WARPS + threadIdx.x / 32, k0 = j * ENC_CHUNK;
    return enc_chunk{j, k0, (int)(n - k0 < ENC_CHUNK ? n - k0 : ENC_CHUNK)};
}

// Pass 1: warp j sums the rows of dout at the positions pos[k] of its chunk of sorted keys, in
// order of k, run by run: a run within the chunk goes to dwte[key, :]; the piece of a run that
// began in an earlier chunk to head[j, :] (the whole chunk when one run spans it), and the piece
// of one that begins here and goes on into the next chunk to tail[j, :]. Keys Vl (not this
// shard's) add nothing. ENC_LOADS rows are loaded (with the dwte rows they end in) before they are
// added; a lane takes a vector of W columns, a warp 32 W of them (blockIdx.y: which).
template <typename T, int W>
__global__ void encoder_wte_chunks_kernel(T *dwte, float *head, float *tail, const T *dout, const uint32_t *keys,
                                          const int32_t *pos, int n, int Vl, int C) {
    cuda_pdl_begin();
    enc_chunk ch = enc_chunk_of(n);
    if (ch.k0 >= n) return;
    int lane = threadIdx.x % 32, len = ch.len;
    uint32_t key = lane < len ? keys[ch.k0 + lane] : 0xffffffffu, next = __shfl_down_sync(0xffffffffu, key, 1);
    int32_t p = lane < len ? pos[ch.k0 + lane] : 0;
    // bit r: a run ends at row r
    unsigned ends = __ballot_sync(0xffffffffu, lane < len && (lane == len - 1 || next != key));
    int first_end = __ffs(ends) - 1;
    bool from_prev = ch.k0 > 0 && keys[ch.k0 - 1] == __shfl_sync(0xffffffffu, key, 0);
    bool to_next = ch.k0 + len < n && keys[ch.k0 + len] == __shfl_sync(0xffffffffu, key, len - 1);
    int c = (blockIdx.y * 32 + lane) * W;
    bool on = c < C;
    float s[W] = {};
    for (int r0 = 0; r0 < len; r0 += ENC_LOADS) {
        T x[ENC_LOADS][W], d[ENC_LOADS][W];
#pragma unroll
        for (int u = 0; u < ENC_LOADS; u++) {
            int r = r0 + u;
            int32_t pr = __shfl_sync(0xffffffffu, p, r % 32);
            uint32_t kr = __shfl_sync(0xffffffffu, key, r % 32);
            bool own = (ends >> r & 1) && !(r <= first_end && from_prev) && !(r == len - 1 && to_next);
            if (on && r < len) vload_raw<T, W>(x[u], dout + (int64_t)pr * C + c);
            if (on && r < len && own && kr < (uint32_t)Vl) vload_raw<T, W>(d[u], dwte + (int64_t)kr * C + c);
        }
#pragma unroll
        for (int u = 0; u < ENC_LOADS; u++) {
            int r = r0 + u;
            if (r >= len) break;
            uint32_t kr = __shfl_sync(0xffffffffu, key, r % 32);
#pragma unroll
            for (int k = 0; k < W; k++) s[k] += to_f32(x[u][k]); // the rows in order
            if (!(ends >> r & 1)) continue;
            if (on && kr < (uint32_t)Vl) {
                float *piece = r <= first_end && from_prev ? head : r == len - 1 && to_next ? tail : NULL;
                if (piece) {
#pragma unroll
                    for (int k = 0; k < W; k++) piece[ch.j * C + c + k] = s[k];
                } else {
                    float y[W];
#pragma unroll
                    for (int k = 0; k < W; k++) y[k] = to_f32(d[u][k]) + s[k];
                    vstore<T, W>(dwte + (int64_t)kr * C + c, y);
                }
            }
#pragma unroll
            for (int k = 0; k < W; k++) s[k] = 0.0f;
        }
    }
}

// Pass 2: warp j, when its chunk's last run began in it and goes on into the next chunk, adds to
// that run's dwte row tail[j, :] + head[j + 1, :] + ... over the chunks the run covers, in order
// (columns as pass 1's)
template <typename T, int W>
__global__ void encoder_wte_runs_kernel(T *dwte, const float *head, const float *tail, const uint32_t *keys, int n,
                                        int Vl, int C) {
    cuda_pdl_begin();
    enc_chunk ch = enc_chunk_of(n);
    int lane = threadIdx.x % 32;
    if (ch.k0 + ch.len >= n) return; // no chunk after it
    uint32_t key = keys[ch.k0 + ch.len - 1];
    if (key >= (uint32_t)Vl || keys[ch.k0 + ch.len] != key) return;
    if (ch.k0 > 0 && keys[ch.k0] == key && keys[ch.k0 - 1] == key) return; // the run began before this chunk
    int64_t end = ch.j + 1; // the first chunk the run does not reach, found 32 chunks at a time
    for (;;) {
        int64_t i = end + lane;
        unsigned in = __ballot_sync(0xffffffffu, i * ENC_CHUNK < n && keys[i * ENC_CHUNK] == key);
        if (~in) {
            end += __ffs(~in) - 1;
            break;
        }
        end += 32;
    }
    int c = (blockIdx.y * 32 + lane) * W;
    if (c >= C) return;
    float s[W];
#pragma unroll
    for (int k = 0; k < W; k++) s[k] = tail[ch.j * C + c + k];
    for (int64_t i0 = ch.j + 1; i0 < end; i0 += ENC_LOADS) {
        float h[ENC_LOADS][W];
#pragma unroll
        for (int u = 0; u < ENC_LOADS; u++)
            if (i0 + u < end) vload<float, W>(h[u], head + (i0 + u) * C + c);
#pragma unroll
        for (int u = 0; u < ENC_LOADS; u++)
            if (i0 + u < end)
#pragma unroll
                for (int k = 0; k < W; k++) s[k] += h[u][k]; // the chunks in order
    }
    float y[W];
    vload<T, W>(y, dwte + (int64_t)key * C + c);
#pragma unroll
    for (int k = 0; k < W; k++) y[k] += s[k];
    vstore<T, W>(dwte + (int64_t)key * C + c, y);
}

// dwpe[t, c] += sum over b in order of dout[b, t, c], W columns a thread (the b loads in flight)
template <typename T, int W>
__global__ void encoder_backward_wpe_kernel(T *dwpe, const T *dout, int B, int64_t TC) {
    cuda_pdl_begin();
    GRID_STRIDE(i, TC / W) {
        float s[W] = {}, x[W];
        for (int b = 0; b < B; b++) {
            vload<T, W>(x, dout + b * TC + i * W);
#pragma unroll
            for (int k = 0; k < W; k++) s[k] += x[k];
        }
        vload<T, W>(x, dwpe + i * W);
#pragma unroll
        for (int k = 0; k < W; k++) x[k] += s[k];
        vstore<T, W>(dwpe + i * W, x);
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

// The n-element arrays of the sort, the pieces of the runs that cross chunks (head, tail: a row
// of C fp32 a chunk each) and CUB's temporary storage, carved out of the scratch buffer at
// 256-byte boundaries.
typedef struct {
    uint32_t *keys, *sorted_keys; // shard rows (Vl: none)
    int32_t *vals, *pos;
    float *head, *tail;
    void *temp;
    size_t temp_bytes;
} enc_groups;

static enc_groups enc_groups_of(loom_cuda *cu, int n, int64_t C, int end_bit) {
    enc_groups g = {};
    size_t arr = cuda_align256((size_t)n * sizeof(int32_t));
    size_t pieces = cuda_align256((size_t)(n / ENC_CHUNK + 1) * C * sizeof(float));
    CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(NULL, g.temp_bytes, g.keys, g.sorted_keys, g.vals, g.pos, n, 0, end_bit));
    char *p = (char *)cuda_scratch(cu, 4 * arr + 2 * pieces + g.temp_bytes);
    g.keys = (uint32_t *)p, g.vals = (int32_t *)(p + arr), g.sorted_keys = (uint32_t *)(p + 2 * arr);
    g.pos = (int32_t *)(p + 3 * arr), g.head = (float *)(p + 4 * arr), g.tail = (float *)(p + 4 * arr + pieces);
    g.temp = p + 4 * arr + 2 * pieces;
    return g;
}

extern "C" void cuda_encoder_backward(loom_backend *be, loom_tensor dwte, loom_tensor dwpe,
                                      loom_tensor dout, loom_tensor tokens, int vocab_start) {
    loom_cuda *cu = cuda_of(be);
    bool bf = cuda_act(be, dwte);
    LOOM_CHECK(tokens.ndim == 2 && cuda_act(be, dwpe) == bf && cuda_act(be, dout) == bf && vocab_start >= 0);
    int64_t B = tokens.shape[0], Tn = tokens.shape[1], C = loom_cols(&dwte), Vl = loom_rows(&dwte); // Tn: as forward
    LOOM_CHECK(loom_numel(&dout) == B * Tn * C && loom_cols(&dwpe) == C && Tn <= loom_rows(&dwpe));
    int n = (int)(B * Tn), end_bit = 1;
    if (!n || !C) return;
    while ((1LL << end_bit) <= Vl) end_bit++; // keys lie in [0, Vl]
    enc_groups g = enc_groups_of(cu, n, C, end_bit);
    cuda_launch(cu->stream, encoder_keys_kernel, cuda_blocks(n, ENC_THREADS), ENC_THREADS, 0, g.keys, g.vals,
                cuda_i32(tokens), n, vocab_start, (int)Vl);
    size_t tb = g.temp_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(g.temp, tb, g.keys, g.sorted_keys, g.vals, g.pos, n, 0, end_bit,
                                               cu->stream));
    CUDA_DISPATCH(bf, cuda_vec_ok(bf, C, dwte.data, dwpe.data, dout.data), {
        dim3 blocks((unsigned)((n + ENC_CHUNK * ENC_WARPS - 1) / (ENC_CHUNK * ENC_WARPS)),
                    (unsigned)((C + 32 * W - 1) / (32 * W)));
        cuda_launch(cu->stream, encoder_wte_chunks_kernel<T, W>, blocks, 32 * ENC_WARPS, 0, (T *)dwte.data, g.head,
                    g.tail, (const T *)dout.data, g.sorted_keys, g.pos, n, (int)Vl, (int)C);
        cuda_launch(cu->stream, encoder_wte_runs_kernel<T, W>, blocks, 32 * ENC_WARPS, 0, (T *)dwte.data, g.head,
                    g.tail, g.sorted_keys, n, (int)Vl, (int)C);
        cuda_launch(cu->stream, encoder_backward_wpe_kernel<T, W>, cuda_blocks(Tn * C / W, ENC_THREADS), ENC_THREADS,
                    0, (T *)dwpe.data, (const T *)dout.data, (int)B, Tn * C);
    });
}
