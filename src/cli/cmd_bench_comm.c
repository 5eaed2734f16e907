// `loom bench-comm`: collective bandwidth over the ranks of the launch, as nccl-tests reports
// it (NVIDIA/nccl-tests, doc/PERFORMANCE.md): for each size, the time of one operation (mean
// over the timed iterations, the slowest rank's), algbw = size / time, and busbw = algbw x the
// op's factor — all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n;
// broadcast 1 — comparable with the link's bandwidth whatever n is. Size is the full buffer
// (all-gather: what each rank receives).
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "comm/comm.h"
#include "core/log.h"
#include "core/timer.h"
#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

typedef enum { OP_ALLREDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_ALLTOALL, OP_BROADCAST, NUM_OPS } bench_op;
static const char *OP_NAMES[NUM_OPS] = {"allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast"};

static double bus_factor(bench_op op, int n) {
    if (op == OP_ALLREDUCE) return 2.0 * (n - 1) / n;
    if (op == OP_BROADCAST) return 1.0;
    return (double)(n - 1) / n;
}

// "64M", "1K", "4G", "1000" -> bytes
static loom_status parse_bytes(const char *flag, const char *text, size_t *out) {
    char *end;
    double v = strtod(text, &end);
    double mult = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1.0;
    if (*end && mult != 1.0) end++;
    if (end == text || *end || !(v >= 1 && v * mult <= 0x1p40))
        return loom_fail(LOOM_EINVAL, "e.g. 1K, 64M, 4G", "--%s: '%s' is not a size from 1 byte to 1024G", flag, text);
    *out = (size_t)(v * mult);
    return LOOM_OK;
}

static loom_status run_op(loom_comm *c, bench_op op, void *send, void *recv, size_t count, loom_dtype dt) {
    switch (op) {
    case OP_ALLREDUCE: return loom_allreduce(c, recv, count, dt, LOOM_SUM, NULL);
    case OP_REDUCE_SCATTER: return loom_reduce_scatter(c, send, recv, count, dt, LOOM_SUM, NULL);
    case OP_ALLGATHER: return loom_allgather(c, send, recv, count, dt, NULL);
    case OP_ALLTOALL: return loom_alltoall(c, send, recv, count, dt, NULL);
    default: return loom_broadcast(c, recv, count, dt, 0, NULL);
    }
}

// The groups of a run: `dev` moves the buffers (MPI for host memory; NCCL, or MPI staged
// through host memory, for GPU memory), `host` the timings.
typedef struct {
    loom_comm *dev, *host;
    loom_backend *be;
} bench_ctx;

// Mean seconds per operation on the slowest rank.
static loom_status time_op(const bench_ctx *x, bench_op op, void *send, void *recv, size_t count, loom_dtype dt,
                           int warmup, int iters, double *seconds) {
    for (int i = 0; i < warmup; i++) LOOM_TRY(run_op(x->dev, op, send, recv, count, dt));
    x->be->synchronize(x->be);
    LOOM_TRY(loom_barrier(x->host));
    double t0 = loom_now();
    for (int i = 0; i < iters; i++) LOOM_TRY(run_op(x->dev, op, send, recv, count, dt));
    x->be->synchronize(x->be); // waiting on a GPU collective makes the backend's stream wait for it
    double mine = (loom_now() - t0) / iters;
    int W = loom_comm_size(x->host);
    double *all = loom_xmalloc((size_t)W * sizeof(double));
    loom_status s = loom_allgather(x->host, &mine, all, 1, LOOM_F64, NULL);
    *seconds = 0;
    for (int r = 0; r < W; r++) *seconds = all[r] > *seconds ? all[r] : *seconds;
    free(all);
    return s;
}

// The ops named by --op: one, or all of them.
static loom_status parse_ops(const char *name, bench_op *first, bench_op *last) {
    *first = 0, *last = NUM_OPS - 1;
    if (strcmp(name, "all") == 0) return LOOM_OK;
    for (*first = 0; *first < NUM_OPS && strcmp(name, OP_NAMES[*first]) != 0; (*first)++) {}
    *last = *first;
    if (*first < NUM_OPS) return LOOM_OK;
    return loom_fail(LOOM_EINVAL, "ops: allreduce, reduce_scatter, allgather, alltoall, broadcast, all",
                     "unknown collective '%s'", name);
}

// The group for GPU buffers named by --device-comm: NCCL, or MPI staged through host memory
// (ranks sharing a GPU).
static loom_status open_device_comm(const char *name, loom_comm *c, loom_backend *be, loom_comm **dev) {
    bool nccl = strcmp(name, "nccl") == 0;
    if (!nccl && strcmp(name, "mpi") != 0)
        return loom_fail(LOOM_EINVAL, "choices are: nccl, mpi", "unknown --device-comm '%s'", name);
    if (!be->stream) return LOOM_OK; // host buffers: the launch's own group
    return nccl ? loom_comm_nccl(c, be->stream, dev) : loom_comm_staged(c, be->stream, dev);
}

static loom_status bench(const bench_ctx *x, bench_op first, bench_op last, size_t lo, size_t hi, int warmup,
                         int iters) {
    loom_backend *be = x->be;
    int W = loom_comm_size(x->host);
    loom_dtype dt = be->dtype;
    size_t es = loom_dtype_size(dt);
    void *send = be->alloc(be, hi), *recv = be->alloc(be, hi);
    if (!send || !recv) {
        be->free(be, send);
        be->free(be, recv);
        return loom_fail(LOOM_ENOMEM, "lower --max-bytes", "cannot allocate 2 x %zu bytes", hi);
    }
    loom_info("# loom bench-comm: %d rank%s, backend %s, %s buffers, %d warm-up + %d timed iterations\n", W,
              loom_plural(W), loom_comm_backend(x->dev), be->name, warmup, iters);
    if (W == 1)
        loom_info("# note: on 1 rank nothing is communicated: these numbers time a local copy and measure nothing\n"
                  "#       of a network or interconnect (launch 2 or more ranks: mpirun -np 2 loom bench-comm)\n");
    loom_info("# %-15s %12s %12s %6s %11s %11s %11s\n", "op", "size(B)", "count", "type", "time(us)",
              "algbw(GB/s)", "busbw(GB/s)");
    loom_status s = LOOM_OK;
    for (bench_op op = first; op <= last && s == LOOM_OK; op++)
        for (size_t bytes = lo; bytes <= hi && s == LOOM_OK; bytes *= 2) {
            size_t count = bytes / es; // elements of the whole buffer
            if (op != OP_ALLREDUCE && op != OP_BROADCAST) count /= (size_t)W;
            if (count == 0) continue;
            size_t size = (op == OP_ALLREDUCE || op == OP_BROADCAST ? count : count * (size_t)W) * es;
            double t;
            s = time_op(x, op, send, recv, count, dt, warmup, iters, &t);
            if (s == LOOM_OK)
                loom_info("  %-15s %12zu %12zu %6s %11.1f %11.2f %11.2f\n", OP_NAMES[op], size, count,
                          loom_dtype_name(dt), t * 1e6, size / t / 1e9, size / t / 1e9 * bus_factor(op, W));
        }
    be->free(be, send);
    be->free(be, recv);
    return s;
}

int loom_cmd_bench_comm(int argc, char **argv) {
    loom_comm *c;
    loom_status s = loom_comm_world(&argc, &argv, &c);
    if (s != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    loom_log_set_rank(loom_comm_rank(c), loom_comm_size(c));
    const char *op = "allreduce", *min_text = "1K", *max_text = "64M", *device = "cpu", *precision = "fp32",
               *device_comm = "nccl";
    int warmup = 5, iters = 20;
    const loom_flag flags[] = {
        {"op", FLAG_STR, &op, "allreduce, reduce_scatter, allgather, alltoall, broadcast or all"},
        {"min-bytes", FLAG_STR, &min_text, "smallest buffer (K, M, G suffixes)"},
        {"max-bytes", FLAG_STR, &max_text, "largest buffer; sizes double from the smallest"},
        {"warmup", FLAG_INT, &warmup, "untimed operations per size", 0, 1000000},
        {"iters", FLAG_INT, &iters, "timed operations per size", 1, 1000000},
        {"device", FLAG_STR, &device,
         "where the buffers live: cpu (MPI) or cuda (the GPU of the local rank; see --device-comm)"},
        {"precision", FLAG_STR, &precision, "element type: fp32 or bf16 (GPU)"},
        {"device-comm", FLAG_STR, &device_comm,
         "collectives on GPU buffers: nccl, or mpi (staged through host memory, for ranks sharing a GPU)"},
    };
    const loom_cli cli = {"bench-comm", "Bandwidth of the collectives over the launched ranks (nccl-tests style).",
                          "mpirun -np N loom bench-comm [--op all --min-bytes 1K --max-bytes 64M]", flags,
                          (int)(sizeof flags / sizeof flags[0]), 0};
    bool help;
    char **pos;
    int npos;
    size_t lo = 0, hi = 0;
    bench_op first = 0, last = 0;
    loom_backend *be = NULL;
    s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && !help) s = parse_ops(op, &first, &last);
    if (s == LOOM_OK && !help) s = parse_bytes("min-bytes", min_text, &lo);
    if (s == LOOM_OK && !help) s = parse_bytes("max-bytes", max_text, &hi);
    if (s == LOOM_OK && !help && lo > hi)
        s = loom_fail(LOOM_EINVAL, "give --min-bytes <= --max-bytes", "--min-bytes %zu exceeds --max-bytes %zu", lo, hi);
    if (s == LOOM_OK && !help) s = cli_open_backend(device, precision, 0, loom_comm_local_rank(c), &be);
    bench_ctx x = {c, c, be};
    if (s == LOOM_OK && !help) s = open_device_comm(device_comm, c, be, &x.dev);
    bool report = loom_comm_rank(c) == 0;
    s = loom_comm_agree(c, s, &report);
    if (s == LOOM_OK && !help) s = bench(&x, first, last, lo, hi, warmup, iters);
    if (s != LOOM_OK && report) loom_print_error();
    if (x.dev != c) loom_comm_free(x.dev);
    loom_backend_destroy(be);
    loom_comm_finalize(c);
    return s == LOOM_OK ? 0 : 1;
}
