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
#define AP_DSTS 3     // destinations of one add at most
#define AP_JOBS 8     // adds of one add_partials launch at most
#define SUMSQ_CHUNK (1 << 16) // elements per block of the first sumsq pass
#define SUMSQ_THREADS 256

int64_t cuda_row_chunk(int64_t N) {
    // at most 256 chunks (so the in-order pass over chunks stays short), at least 32 rows each
    int64_t chunk = (N + 255) / 256;
    return chunk < 32 ? 32 : chunk;
}

// An add of partial sums into up to AP_DSTS destinations: column i of the ndst * n goes to
// dst[i / n][i % n], added to what is there (add) or written; the partials (nparts, stride) fp32.
// A launch takes up to AP_JOBS of them, ap_blocks blocks each from block `first`.
typedef struct {
    void *dst[AP_DSTS];
    const float *partials;
    int64_t nparts, stride, n;
    int ndst, first;
    bool bf, add;
} ap_job;
typedef struct {
    ap_job job[AP_JOBS];
    int njobs;
} ap_jobs;
static inline int ap_blocks(const ap_job &j) { return (int)((j.ndst * j.n + AP_COLS - 1) / AP_COLS); }

// A block adds AP_COLS columns of its job: thread (column x, group g) sums partials g, g +
// AP_GROUPS, ... in order, then the groups' sums are added in group order. Fixed for given nparts.
__global__ void add_partials_kernel(ap_jobs jobs) {
    cuda_pdl_begin();
    __shared__ float sh[AP_GROUPS][AP_COLS];
    int k = 0;
    while (k + 1 < jobs.njobs && (int)blockIdx.x >= jobs.job[k + 1].first) k++;
    const ap_job &j = jobs.job[k];
    int x = threadIdx.x % AP_COLS, g = threadIdx.x / AP_COLS;
    int64_t i = (int64_t)(blockIdx.x - j.first) * AP_COLS + x;
    float s = 0.0f;
    if (i < j.ndst * j.n)
        for (int64_t p = g; p < j.nparts; p += AP_GROUPS) s += j.partials[p * j.stride + i];
    sh[g][x] = s;
    __syncthreads();
    if (g > 0 || i >= j.ndst * j.n) return;
    float total = 0.0f;
    for (int q = 0; q < AP_GROUPS; q++) total += sh[q][x];
    void *d = j.dst[i / j.n];
    i %= j.n;
    stx(d, i, j.add ? ldx(d, i, j.bf) + total : total, j.bf);
}

// The adds waiting (the backend's grads_defer) and the buffer their partials live in
// (cuda_partials): `used` bytes of it, free again once the adds are launched.
struct cuda_partials_buf {
    ap_jobs pending;
    void *buf;
    size_t bytes, used;
};

static cuda_partials_buf *partials_buf(loom_cuda *cu) {
    if (!cu->partials) cu->partials = (cuda_partials_buf *)loom_xcalloc(1, sizeof(cuda_partials_buf));
    return cu->partials;
}

void cuda_flush_partials(loom_cuda *cu) {
    cuda_partials_buf *pb = cu->partials;
    if (!pb || !pb->pending.njobs) return;
    int blocks = 0;
    for (int k = 0; k < pb->pending.njobs; k++) {
        pb->pending.job[k].first = blocks;
        blocks += ap_blocks(pb->pending.job[k]);
    }
    cuda_launch(cu->stream, add_partials_kernel, (unsigned)blocks, AP_COLS * AP_GROUPS, 0, pb->pending);
    pb->pending.njobs = 0;
    pb->used = 0; // ops after the launch may write there again: they wait for it (cuda_ops.h)
}

float *cuda_partials(loom_cuda *cu, size_t bytes) {
    cuda_partials_buf *pb = partials_buf(cu);
    bytes = cuda_align256(bytes);
    if (pb->used + bytes > pb->bytes) cuda_flush_partials(cu); // the waiting adds read what is there
    // partials taken and not yet added (an op's own, before its add) cannot move: growing the
    // buffer would lose them, and past its end they would overflow it
    LOOM_CHECK(pb->used == 0 || pb->used + bytes <= pb->bytes);
    cuda_grow(cu, &pb->buf, &pb->bytes, bytes);
    float *p = (float *)((char *)pb->buf + pb->used);
    pb->used += bytes;
    return p;
}

void cuda_partials_free(loom_cuda *cu) {
    if (!cu->partials) return;
    if (cu->partials->buf) CUDA_CHECK(cudaFree(cu->partials->buf));
    free(cu->partials);
    cu->partials = NULL;
}

// Whether the destinations of two adds share a byte
static bool ap_overlap(const ap_job &a, const ap_job &b) {
    for (int x = 0; x < a.ndst; x++)
        for (int y = 0; y < b.ndst; y++) {
            const char *p = (const char *)a.dst[x], *q = (const char *)b.dst[y];
            if (p < q + b.n * (b.bf ? 2 : 4) && q < p + a.n * (a.bf ? 2 : 4)) return true;
        }
    return false;
}

void cuda_add_partials_n(loom_cuda *cu, void *const *dst, int ndst, bool dst_bf, bool add, const float *partials,
                         int64_t nparts, int64_t stride, int64_t n) {
    LOOM_CHECK(ndst >= 1 && ndst <= AP_DSTS);
    if (!n) return;
    cuda_partials_buf *pb = partials_buf(cu);
    ap_job j = {};
    for (int k = 0; k < ndst; k++) j.dst[k] = dst[k];
    j.partials = partials, j.nparts = nparts, j.stride = stride, j.n = n, j.ndst = ndst, j.bf = dst_bf, j.add = add;
    // an add waiting for a destination this one touches goes first, and so do all when the table is full
    bool before = pb->pending.njobs == AP_JOBS;
    for (int k = 0; k < pb->pending.njobs; k++) before |= ap_overlap(pb->pending.job[k], j);
    if (before) cuda_flush_partials(cu);
    pb->pending.job[pb->pending.njobs++] = j;
    // it waits only while asked to, and where its partials stay until then (cuda_partials)
    const char *at = (const char *)pb->buf;
    bool kept = at && (const char *)partials >= at && (const char *)partials < at + pb->used;
    if (!cu->base.grads_defer || !kept) cuda_flush_partials(cu);
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
    float *part = cuda_partials(cu, (size_t)(nchunks * n) * sizeof(float));
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
