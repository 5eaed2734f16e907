// --cuda-graphs: the whole training step — zeroing the gradients, each micro-batch's tokens,
// forward and backward (and the roll of FP8 delayed scaling's amaxes), the gradient norm,
// clipping and AdamW — recorded once through the
// backend's graph ops and replayed every step as one launch, with no host round trip inside it
// (as torch.cuda.graph records a whole fixed-shape step). One rank only (trainer.c's
// check_cuda_graphs): no collective sits in the step, and the gradients need no reduction.
//
// What changes from step to step reaches the recording through host_alloc (page-locked) memory
// that it copies from when it runs: before a replay the host writes each of the A micro-batches'
// tokens into a slot of its own, and the step's scalars (loom_step_scalars: learning rate, step
// number, bias corrections; loom_adamw_scalars). The step's first op copies the scalars to the
// backend; the gradient's sum of squares is added up there (loom_dp_local_grads), the clipping
// factor and the skip flag derived from it and the micro-batches' per-token losses (step_scalars:
// a loss or the norm not finite skips the update), and AdamW reads them all from there
// (loom_adamw_step_scalars). The last ops copy the scalars and the losses back, from which the
// host computes the loss and the norm with the op-by-op step's arithmetic after one wait: a run is
// bit-identical to one without --cuda-graphs, skipped steps included.
//
// The first step runs op by op, which sizes every buffer the ops use (a recording may not
// allocate). A replay the backend refuses (its per-op scratch moved since the recording: an
// evaluation or a sample needed more) records again. A backend without graphs (the CPU, in the
// tests) runs the same ops each step instead of recording them.
#include "core/timer.h"
#include "train/trainer_internal.h"

#include <math.h>

struct loom_step_graph {
    void *graph;              // the recording (NULL: none yet)
    bool sized;               // a step ran op by op: every buffer the ops use is at its size
    loom_step_scalars *host;  // host_alloc: this step's scalars in; after the replay, the device's back
    loom_step_scalars *dev;   // backend memory: the scalars the ops read and write
    int32_t *tokens;          // host_alloc (A,2,N): micro-batch a's inputs, then its targets
    float *losses, *host_losses; // (A,N) fp32 per-token losses: backend memory, and host_alloc
    int64_t N;                // tokens of a micro-batch (B x T)
};

void loom_step_graph_free(loom_step_graph *g, loom_backend *be) {
    if (!g) return;
    if (g->graph) be->graph_free(be, g->graph);
    be->host_free(be, g->host);
    be->free(be, g->dev);
    be->host_free(be, g->tokens);
    be->free(be, g->losses);
    be->host_free(be, g->host_losses);
    free(g);
}

loom_status loom_step_graph_create(loom_step_graph **out, loom_trainer *t) {
    loom_backend *be = t->be;
    int A = t->grad_accum;
    loom_step_graph *g = loom_xcalloc(1, sizeof *g);
    g->N = (int64_t)t->cfg.batch * loom_train_seq_rows(t);
    size_t tokens = (size_t)(2 * A * g->N) * sizeof(int32_t), losses = (size_t)(A * g->N) * sizeof(float);
    g->host = be->host_alloc(be, sizeof *g->host);
    g->dev = be->alloc(be, sizeof *g->dev);
    g->tokens = be->host_alloc(be, tokens);
    g->losses = be->alloc(be, losses);
    g->host_losses = be->host_alloc(be, losses);
    *out = g;
    if (g->host && g->dev && g->tokens && g->losses && g->host_losses) return LOOM_OK;
    loom_step_graph_free(g, be);
    *out = NULL;
    return loom_fail(LOOM_ENOMEM, "drop --cuda-graphs, or lower --batch or --global-batch",
                     "--cuda-graphs: cannot allocate the step's %zu bytes of tokens and %zu of losses", tokens,
                     losses);
}

// The step's ops, all in order on the backend's stream and none waiting for it (what a
// recording holds): the scalars in, zeroed gradients, the micro-batches, the norm, the update,
// the scalars and the losses out.
static loom_status issue(loom_trainer *t) {
    loom_step_graph *g = t->graph;
    loom_backend *be = t->be;
    loom_gpt2 *m = t->model;
    const loom_train_config *c = &t->cfg;
    int A = t->grad_accum;
    be->copy(be, g->dev, g->host, sizeof *g->dev);
    loom_gpt2_zero_grads(m);
    LOOM_TRY(loom_train_fp8_begin(t));
    for (int a = 0; a < A; a++) {
        const int32_t *inputs = g->tokens + 2 * a * g->N;
        loom_dp_begin_micro_batch(t->dp, m->grads, a == 0, loom_dp_syncs(t->dp, a, A));
        loom_gpt2_copy_batch(m, 0, inputs, inputs + g->N, c->batch, loom_train_seq_rows(t));
        loom_tensor losses = loom_gpt2_forward_backward_losses(m, 1.0f / (float)A);
        be->copy(be, g->losses + a * g->N, losses.data, (size_t)g->N * sizeof(float));
        LOOM_TRY(loom_dp_end_micro_batch(t->dp));
    }
    LOOM_TRY(loom_train_fp8_end(t)); // one rank: the roll alone
    loom_dp_local_grads(t->dp, &t->reduced, &g->dev->sumsq);
    int64_t n = A * g->N;
    be->step_scalars(be, g->dev, loom_view_dims(g->losses, LOOM_F32, &n, 1), c->adamw.grad_clip);
    loom_adamw_step_scalars(t->opt, loom_train_params(t, NULL), t->reduced, &c->adamw, g->dev);
    be->copy(be, g->host, g->dev, sizeof *g->dev);
    be->copy(be, g->host_losses, g->losses, (size_t)n * sizeof(float));
    return LOOM_OK;
}

// The step's ops run: the recording replayed, or recorded first (none yet, or the backend
// refused it); on a backend without graphs, issued.
static loom_status replay(loom_trainer *t) {
    loom_step_graph *g = t->graph;
    loom_backend *be = t->be;
    if (!be->graph_begin) return issue(t);
    if (g->graph && be->graph_launch(be, g->graph)) return LOOM_OK;
    if (g->graph) be->graph_free(be, g->graph);
    g->graph = NULL;
    be->graph_begin(be);
    loom_status s = issue(t);
    void *graph = be->graph_end(be);
    if (s != LOOM_OK) {
        be->graph_free(be, graph);
        return s;
    }
    g->graph = graph;
    LOOM_CHECK(be->graph_launch(be, graph));
    return LOOM_OK;
}

loom_status loom_step_graph_step(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out) {
    loom_step_graph *g = t->graph;
    loom_backend *be = t->be;
    if (!g->sized) {
        g->sized = true;
        return loom_train_step_ops(t, batch, ctx, out);
    }
    int A = t->grad_accum;
    uint64_t first = loom_train_first_micro_batch(t);
    for (int a = 0; a < A; a++) {
        int32_t *inputs = g->tokens + 2 * a * g->N;
        batch(ctx, first + (uint64_t)a, inputs, inputs + g->N);
    }
    out->lr = loom_lr_at(&t->cfg.lr, t->st.step);
    loom_adamw_scalars(t->opt, &t->cfg.adamw, out->lr, g->host);
    LOOM_TRY(replay(t));
    be->synchronize(be);
    t->time_opt = 0, t->time_wait = 0;
    double sum = 0;
    for (int a = 0; a < A; a++) sum += loom_gpt2_mean_loss(g->host_losses + a * g->N, g->N);
    out->loss = sum / A;
    out->norm = sqrt(g->host->sumsq);
    out->skipped = !isfinite(out->loss) || !isfinite(out->norm);
    LOOM_CHECK(out->skipped == (g->host->skip != 0)); // the device decided as the host does
    if (out->skipped) {
        loom_train_skip(t);
        return LOOM_OK;
    }
    t->opt->t++; // the update the replay ran
    loom_train_updated(t, out);
    return LOOM_OK;
}
