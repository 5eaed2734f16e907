// Host memory for offloading and the copies between it and the device on a side stream (the
// backend table's host_alloc, host_free, copy_async, copy_wait; contracts in backend/backend.h).
//
// A copy waits for the ops issued before it (an event recorded on the op stream), runs on
// copy_stream, and records its own event, kept in a ring of CUDA_COPY_EVENTS by ticket. The
// copy stream runs its copies in order, so waiting for a ticket whose event was reused by a
// later copy (more than CUDA_COPY_EVENTS copies ago) waits for that later copy, which is no
// less safe.
#include "backend/cuda/cuda_ops.h"

#include <string.h>
#include <uthash.h>

struct cuda_host_block { // one live page-locked allocation
    void *ptr;
    size_t bytes;
    UT_hash_handle hh;
};

void *cuda_host_alloc(loom_backend *be, size_t bytes) {
    loom_cuda *cu = cuda_of(be);
    size_t n = bytes == 0 ? 64 : bytes;
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, n);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return NULL;
    }
    CUDA_CHECK(e);
    memset(p, 0, n);
    cuda_host_block *b = (cuda_host_block *)loom_xmalloc(sizeof *b);
    b->ptr = p;
    b->bytes = n;
    HASH_ADD_PTR(cu->host_blocks, ptr, b);
    be->host_bytes_in_use += n;
    if (be->host_bytes_in_use > be->host_peak_bytes) be->host_peak_bytes = be->host_bytes_in_use;
    return p;
}

void cuda_host_free(loom_backend *be, void *p) {
    if (!p) return;
    loom_cuda *cu = cuda_of(be);
    CUDA_CHECK(cudaStreamSynchronize(cu->stream)); // no op or copy may still use it
    if (cu->copy_stream) CUDA_CHECK(cudaStreamSynchronize(cu->copy_stream));
    cuda_host_block *b;
    HASH_FIND_PTR(cu->host_blocks, &p, b);
    LOOM_CHECK(b); // freeing what this backend did not allocate
    be->host_bytes_in_use -= b->bytes;
    HASH_DEL(cu->host_blocks, b);
    free(b);
    CUDA_CHECK(cudaFreeHost(p));
}

uint64_t cuda_copy_async(loom_backend *be, void *dst, const void *src, size_t bytes, bool to_host) {
    loom_cuda *cu = cuda_of(be);
    if (!cu->copy_stream) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&cu->copy_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&cu->ops_done, cudaEventDisableTiming));
        cu->copy_done = (cudaEvent_t *)loom_xmalloc(CUDA_COPY_EVENTS * sizeof(cudaEvent_t));
        for (int i = 0; i < CUDA_COPY_EVENTS; i++)
            CUDA_CHECK(cudaEventCreateWithFlags(&cu->copy_done[i], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(cu->ops_done, cu->stream));
    CUDA_CHECK(cudaStreamWaitEvent(cu->copy_stream, cu->ops_done, 0));
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                   cu->copy_stream));
    uint64_t ticket = ++cu->copies;
    CUDA_CHECK(cudaEventRecord(cu->copy_done[ticket % CUDA_COPY_EVENTS], cu->copy_stream));
    return ticket;
}

void cuda_copy_wait(loom_backend *be, uint64_t ticket) {
    loom_cuda *cu = cuda_of(be);
    if (ticket == 0 || !cu->copy_stream) return;
    // the newest event recorded at or after the ticket's copy
    uint64_t at = cu->copies - ticket >= CUDA_COPY_EVENTS ? cu->copies : ticket;
    CUDA_CHECK(cudaStreamWaitEvent(cu->stream, cu->copy_done[at % CUDA_COPY_EVENTS], 0));
}

void cuda_host_copy_destroy(loom_cuda *cu) {
    if (cu->copy_stream) {
        CUDA_CHECK(cudaStreamSynchronize(cu->copy_stream));
        for (int i = 0; i < CUDA_COPY_EVENTS; i++) CUDA_CHECK(cudaEventDestroy(cu->copy_done[i]));
        free(cu->copy_done);
        CUDA_CHECK(cudaEventDestroy(cu->ops_done));
        CUDA_CHECK(cudaStreamDestroy(cu->copy_stream));
    }
    cuda_host_block *b, *tmp;
    HASH_ITER(hh, cu->host_blocks, b, tmp) {
        HASH_DEL(cu->host_blocks, b);
        CUDA_CHECK(cudaFreeHost(b->ptr));
        free(b);
    }
}
