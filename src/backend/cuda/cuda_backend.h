// Public face of the CUDA backend beyond the loom_backend table (backend/backend.h): the one
// CUDA stream every op of a CUDA backend runs on, so that other code (NCCL collectives, copies
// to the host) can order its work against the ops. Only in builds with LOOM_HAVE_CUDA.
#pragma once
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_backend loom_backend;

// The stream of `be`, which must be a backend made by loom_backend_cuda_create.
cudaStream_t loom_cuda_stream(loom_backend *be);

#ifdef __cplusplus
}
#endif
