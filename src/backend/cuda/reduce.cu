// Reductions whose result repeats bit for bit: column sums over the rows of an (N, n) array (row stride ld)
// (parameter gradients: dbias, LayerNorm's dw/db) and the sum of squares (gradient norm).
// No atomics anywhere: every partial sum covers a fixed range and partials are combined in a
// fixed order, so results depend only on the shapes (not on timing or the GPU's SM count).
//   column sums: per (columns, row chunk) a block sums the chunk's rows in a fixed order into
//                partials (nchunks, n) fp32 (16-byte vectors along the rows where aligned);
//                cuda_add_partials adds the chunks in a fixed order (AP_GROUPS interleaved
//                groups, each in order, then the groups in order) into the destination, or
//                writes their sum there (the backend's grads_write).
//   sumsq:       per chunk of SUMSQ_CHUNK elements one block, fp64 per thread then a fixed
//                tree; one block then adds the chunk sums (same pattern); one fp64 comes back
//                (sumsq), or is added to an fp64 in device memory (sumsq_add).
#include "backend/cuda/vec.cuh"

#define COL_VECS 32   // vectors of columns per column_partials block
#define COL_GROUPS 8  // row groups per column_partials block, summed in parallel then in order
#define COL_LOADS 4   // rows a column_partials thread loads before it adds them (in order)
#define AP_COLS 8     // columns per add_partials block (8 fp32: one 32-byte sector a row)
#define AP_GROUPS 32  // groups of partials per column, summed in parallel then in order
#define AP_DSTS 3     // destinations of one add_partials launch at most
#define SUMSQ_CHUNK (1 << 16) // elements per block of the first sumsq pass
#define SUMSQ_THREADS 256

int64_t cuda_row_chunk(int64_t N) {
    // at most 256 chunks (so the in-order pass over chunks stays short), at least 32 rows each
    int64_t chunk = (N + 255) / 256;
    return chunk < 32 ? 32 : chunk;
}

// A block adds AP_COLS columns: thread (column x, group g) sums partials g, g + AP_GROUPS, ...
// in order, then the groups' sums are added in group order. Fixed for given nparts. Column i
// of the ndst * n goes to dst.p[i / n][i % n], added to what is there (add) or written.
typedef struct {
    void *p[AP_DSTS];
} ap_dsts;
__global__ void add_partials_kernel(ap_dsts dst, int ndst, bool bf, bool add, const float *partials, int64_t nparts,
                                    int64_t stride, int64_t n) {
    cuda_pdl_begin();
    __shared__ float sh[AP_GROUPS][AP_COLS];
    int x = threadIdx.x % AP_COLS, g = threadIdx.x / AP_COLS;
    int64_t i = (int64_t)blockIdx.x * AP_COLS + x;
    float s = 0.0f;
    if (i < ndst * n)
        for (int64_t p = g; p < nparts; p += AP_GROUPS) s += partials[p * stride + i];
    sh[g][x] = s;
    __syncthreads();
    if (g > 0 || i >= ndst * n) return;
    float total = 0.0f;
    for (int k = 0; k < AP_GROUPS; k++) total += sh[k][x];
    void *d = dst.p[i / n];
    i %= n;
    stx(d, i, add ? ldx(d, i, bf) + total : total, bf);
}

void cuda_add_partials_n(loom_cuda *cu, void *const *dst, int ndst, bool dst_bf, bool add, const float *partials,
                         int64_t nparts, int64_t stride, int64_t n) {
    LOOM_CHECK(ndst >= 1 && ndst <= AP_DSTS);
    if (!n) return;
    ap_dsts d = {};
    for (int k = 0; k < ndst; k++) d.p[k] = dst[k];
    cuda_launch(cu->stream, add_partials_kernel, (unsigned)((ndst * n + AP_COLS - 1) / AP_COLS), AP_COLS * AP_GROUPS, 0,
                d, ndst, dst_bf, add, partials, nparts, stride, n);
}

void cuda_add_partials(loom_cuda *cu, void *dst, bool dst_bf, bool add, const float *partials, int64_t nparts,
                       int64_t stride, int64_t n) {
    cuda_add_partials_n(cu, &dst, 1, dst_bf, add, partials, nparts, stride, n);
}

// partials[chunk, c] = sum of x[r, c] over the chunk's rows. grid (ceil(n / (COL_VECS W)),
// nchunks): thread (vector v, row group g) sums rows r0 + g, r0 + g + COL_GROUPS, ... of its W
// columns in order, COL_LOADS rows loaded before they are added (one load at a time left the
// kernel waiting on memory: with 4, gpt2-xl's bias sums take 13% less time, gpt2's 7%; ncu, H200),
// then the groups' sums are added in group order through shared memory (element k of vector v of
// group g at [g][k][v], so the lanes of a warp hit distinct banks).
template <typename T, int W>
__global__ void column_partials_kernel(float *partials, const T *x, int64_t N, int64_t n, int64_t ld, int64_t chunk) {
    cuda_pdl_begin();
    __shared__ float sh[COL_GROUPS][W][COL_VECS];
    int v = threadIdx.x % COL_VECS, g = threadIdx.x / COL_VECS;
    int64_t c0 = (int64_t)blockIdx.x * COL_VECS * W, c = c0 + (int64_t)v * W;
    int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < N ? r0 + chunk : N;
    float s[W] = {};
    T xv[COL_LOADS][W]; // as stored: fewer registers, more blocks an SM
    for (int64_t r = r0 + g; c < n && r < r1; r += COL_LOADS * COL_GROUPS) { // COL_LOADS loads in flight
#pragma unroll
        for (int u = 0; u < COL_LOADS; u++)
            if (r + u * COL_GROUPS < r1) vload_raw<T, W>(xv[u], x + (r + u * COL_GROUPS) * ld + c);
#pragma unroll
        for (int u = 0; u < COL_LOADS; u++)
#pragma unroll
            for (int k = 0; k < W; k++)
                if (r + u * COL_GROUPS < r1) s[k] += to_f32(xv[u][k]); // the rows in order
    }
#pragma unroll
    for (int k = 0; k < W; k++) sh[g][k][v] = s[k];
    __syncthreads();
    for (int j = threadIdx.x; j < COL_VECS * W; j += blockDim.x) {
        if (c0 + j >= n) break;
        float total = 0.0f;
        for (int gg = 0; gg < COL_GROUPS; gg++) total += sh[gg][j % W][j / W];
        partials[blockIdx.y * n + c0 + j] = total;
    }
}

void cuda_column_sums(loom_cuda *cu, void *dst, const void *x, int64_t N, int64_t n, int64_t ld, bool bf, bool add) {
    if (!N || !n) return;
    int64_t chunk = cuda_row_chunk(N), nchunks = (N + chunk - 1) / chunk;
    float *part = (float *)cuda_scratch(cu, (size_t)(nchunks * n) * sizeof(float));
    CUDA_DISPATCH(bf, cuda_vec_ok(bf, n, x) && cuda_vec_ok(bf, ld, NULL), {
        dim3 grid((unsigned)((n + COL_VECS * W - 1) / (COL_VECS * W)), (unsigned)nchunks);
        cuda_launch(cu->stream, column_partials_kernel<T, W>, grid, COL_VECS * COL_GROUPS, 0, part, (const T *)x, N, n,
                    ld, chunk);
    });
    cuda_add_partials(cu, dst, bf, add, part, nchunks, n, n);
}

// Fixed-shape tree sum of one double per thread; the total lands in thread 0.
__device__ double block_sum_f64(double s) {
    __shared__ double sh[SUMSQ_THREADS];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = SUMSQ_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    return sh[0];
}

// out[blockIdx.x] = sum of squares of x[chunk blockIdx.x]; x fp32 or bf16
__global__ void sumsq_kernel(double *out, const void *x, int64_t n, int64_t chunk, bool bf) {
    cuda_pdl_begin();
    int64_t i0 = (int64_t)blockIdx.x * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += SUMSQ_THREADS) {
        double v = (double)ldx(x, i, bf);
        s += v * v;
    }
    s = block_sum_f64(s);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// *out = the sum of x (accumulate: *out += it, one fp64 addition as the host's)
__global__ void sum_f64_kernel(double *out, const double *x, int64_t n, bool accumulate) {
    cuda_pdl_begin();
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += SUMSQ_THREADS) s += x[i];
    s = block_sum_f64(s);
    if (threadIdx.x == 0) *out = accumulate ? *out + s : s;
}

// The two passes of the sum of squares of x (n > 0 elements): added to *acc, or (acc NULL) into a
// scratch slot after the chunks' partial sums. Returns where the sum is.
static double *sumsq_launch(loom_cuda *cu, double *acc, loom_tensor x) {
    LOOM_CHECK(x.dtype == LOOM_F32 || x.dtype == LOOM_BF16);
    int64_t n = loom_numel(&x), nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *part = (double *)cuda_scratch(cu, (size_t)(nchunks + 1) * sizeof(double)), *out = acc ? acc : part + nchunks;
    cuda_launch(cu->stream, sumsq_kernel, (unsigned)nchunks, SUMSQ_THREADS, 0, part, x.data, n, SUMSQ_CHUNK,
                x.dtype == LOOM_BF16);
    cuda_launch(cu->stream, sum_f64_kernel, 1, SUMSQ_THREADS, 0, out, part, nchunks, acc != NULL);
    return out;
}

extern "C" double cuda_sumsq(loom_backend *be, loom_tensor x) {
    loom_cuda *cu = cuda_of(be);
    if (!loom_numel(&x)) return 0.0;
    double total = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&total, sumsq_launch(cu, NULL, x), sizeof total, cudaMemcpyDeviceToHost, cu->stream));
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    return total;
}

extern "C" void cuda_sumsq_add(loom_backend *be, double *acc, loom_tensor x) {
    if (loom_numel(&x)) sumsq_launch(cuda_of(be), acc, x);
}
