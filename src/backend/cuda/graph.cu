// CUDA graphs of the backend's stream (the backend table's graph_begin, graph_end, graph_launch,
// graph_free; contracts in backend/backend.h): stream capture in thread-local mode, so a call
// that may not be recorded (an allocation, a synchronisation) fails the capture loudly instead of
// running at the wrong time; the instantiated graph replays every kernel, copy and memset with
// the arguments they had, launched as one unit (the CUDA Programming Guide's "CUDA Graphs").
#include "backend/cuda/cuda_ops.h"

typedef struct {
    cudaGraphExec_t exec;
    uint64_t scratch_moves; // cu->scratch_moves when recorded: the scratch address it holds
} cuda_graph;

void cuda_graph_begin(loom_backend *be) {
    CUDA_CHECK(cudaStreamBeginCapture(cuda_of(be)->stream, cudaStreamCaptureModeThreadLocal));
}

void *cuda_graph_end(loom_backend *be) {
    loom_cuda *cu = cuda_of(be);
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamEndCapture(cu->stream, &graph));
    cuda_graph *g = (cuda_graph *)loom_xmalloc(sizeof *g);
    CUDA_CHECK(cudaGraphInstantiate(&g->exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    g->scratch_moves = cu->scratch_moves;
    return g;
}

bool cuda_graph_launch(loom_backend *be, void *graph) {
    loom_cuda *cu = cuda_of(be);
    cuda_graph *g = (cuda_graph *)graph;
    if (g->scratch_moves != cu->scratch_moves) return false;
    CUDA_CHECK(cudaGraphLaunch(g->exec, cu->stream));
    return true;
}

void cuda_graph_free(loom_backend *be, void *graph) {
    if (!graph) return;
    CUDA_CHECK(cudaStreamSynchronize(cuda_of(be)->stream)); // a launch may still run
    CUDA_CHECK(cudaGraphExecDestroy(((cuda_graph *)graph)->exec));
    free(graph);
}
