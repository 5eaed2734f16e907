// Private to the CUDA-only files of src/comm (comm_nccl.c, comm_staged.c): a CUDA error as a
// loom status.
#pragma once
#include "comm/comm_internal.h"

#include <cuda_runtime.h>

static inline loom_status comm_check_cuda(cudaError_t rc, const char *what) {
    if (rc == cudaSuccess) return LOOM_OK;
    return loom_fail(LOOM_EIO, NULL, "%s failed: %s", what, cudaGetErrorString(rc));
}
