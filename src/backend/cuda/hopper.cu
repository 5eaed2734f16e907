// Tensor maps for the Hopper kernels' bulk tensor copies (hopper.cuh): cuTensorMapEncodeTiled,
// a driver function, reached through the runtime's entry-point query so that loom links no
// driver library (CUDA Programming Guide, "Driver Entry Point Access").
#include "backend/cuda/hopper.cuh"

#include <cudaTypedefs.h> // PFN_cuTensorMapEncodeTiled

CUtensorMap hopper_tensor_map(const void *base, int64_t B, int64_t T, int64_t ld, int rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode; // set once; the same for every device
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                                    cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess) cuda_check_failed("CUDA", "not in the driver", "cuTensorMapEncodeTiled", __FILE__, __LINE__);
    }
    CUtensorMap map;
    cuuint64_t dims[3] = {(cuuint64_t)ld, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[2] = {(cuuint64_t)ld * 2, (cuuint64_t)(T * ld) * 2}; // bytes, of dims 1 and 2
    cuuint32_t box[3] = {64, (cuuint32_t)rows, 1}, step[3] = {1, 1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(base), dims, strides, box, step,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "CUresult %d for (%lld, %lld, %lld) boxes of %d rows", (int)r, (long long)B,
                 (long long)T, (long long)ld, rows);
        cuda_check_failed("CUDA", what, "cuTensorMapEncodeTiled", __FILE__, __LINE__);
    }
    return map;
}
