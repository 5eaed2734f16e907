// A micro-batch's forward and backward as one CUDA graph (gpt2.h's cuda_graphs): the passes'
// kernels are recorded once through the backend's graph ops and then replayed with one launch
// (as torch.cuda.graph does for a fixed-shape step in PyTorch). The loss is read back after the
// replay.
//
// A recording is valid for one micro-batch shape (B, T) and gradient scale, with the buffers the
// ops wrote when it was made: the model's (fixed once allocated) and the backend's per-op scratch
// (graph_launch refuses when that moved: record again). The first micro-batch of a shape runs op
// by op, so that every buffer is at its size before the recording, which may not allocate.
#include "model/gpt2_internal.h"

struct gpt2_graph {
    void *graph;       // the backend's recording (NULL: none yet)
    int B, T;          // the shape it is for, and the one that last ran op by op
    float grad_scale;
};

void gpt2_graph_free(loom_gpt2 *m) {
    if (!m->graph) return;
    if (m->graph->graph) m->be->graph_free(m->be, m->graph->graph);
    free(m->graph);
    m->graph = NULL;
}

static void record(loom_gpt2 *m, float grad_scale) {
    loom_backend *be = m->be;
    if (m->graph->graph) be->graph_free(be, m->graph->graph);
    m->recording = true;
    be->graph_begin(be);
    gpt2_passes(m, grad_scale);
    m->graph->graph = be->graph_end(be);
    m->recording = false;
}

double gpt2_graph_forward_backward(loom_gpt2 *m, float grad_scale) {
    loom_backend *be = m->be;
    LOOM_CHECK(be->graph_begin && m->slots == 1 && !m->offload);
    int B = m->slot_B[0], T = m->slot_T[0];
    gpt2_graph *g = m->graph;
    if (!g || g->B != B || g->T != T || g->grad_scale != grad_scale) { // a new shape: op by op first
        gpt2_graph_free(m);
        m->graph = loom_xcalloc(1, sizeof *m->graph);
        *m->graph = (gpt2_graph){NULL, B, T, grad_scale};
        return gpt2_passes(m, grad_scale);
    }
    if (!g->graph || !be->graph_launch(be, g->graph)) {
        record(m, grad_scale);
        LOOM_CHECK(be->graph_launch(be, g->graph));
    }
    gpt2_views v = gpt2_views_of(m, 0, 0);
    return gpt2_mean_loss(m, &v);
}
