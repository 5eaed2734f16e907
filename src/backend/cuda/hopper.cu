// Tensor maps for the Hopper kernels' bulk tensor copies (hopper.cuh): cuTensorMapEncodeTiled,
// a driver function, reached through the runtime's entry-point query so that loom links no
// driver library (CUDA Programming Guide, "Driver Entry Point Access").
#include "backend/cuda/hopper.cuh"

#include <cudaTypedefs.h> // PFN_cuTensorMapEncodeTiled

static CUtensorMap tensor_map(CUtensorMapDataType type, const void *base, int rank, const cuuint64_t *dims,
                              const cuuint64_t *strides, const cuuint32_t *box) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode; // set once; the same for every device
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                                    cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess) cuda_check_failed("CUDA", "not in the driver", "cuTensorMapEncodeTiled", __FILE__, __LINE__);
    }
    CUtensorMap map;
    cuuint32_t step[3] = {1, 1, 1};
    CUresult r = encode(&map, type, rank, const_cast<void *>(base), dims, strides, box, step,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "CUresult %d for (%lld, %lld, %lld) in boxes of %u rows", (int)r,
                 (long long)(rank > 2 ? dims[2] : 1), (long long)dims[1], (long long)dims[0], box[1]);
        cuda_check_failed("CUDA", what, "cuTensorMapEncodeTiled", __FILE__, __LINE__);
    }
    return map;
}

CUtensorMap hopper_tensor_map(const void *base, int64_t B, int64_t T, int64_t ld, int rows) {
    cuuint64_t dims[3] = {(cuuint64_t)ld, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[2] = {(cuuint64_t)ld * 2, (cuuint64_t)(T * ld) * 2}; // bytes, of dims 1 and 2
    cuuint32_t box[3] = {64, (cuuint32_t)rows, 1};
    return tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, 3, dims, strides, box);
}

CUtensorMap hopper_tensor_map_2d(const void *base, int esize, int64_t rows, int64_t cols, int box_rows) {
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)(cols * esize)};
    cuuint32_t box[2] = {(cuuint32_t)(128 / esize), (cuuint32_t)box_rows};
    return tensor_map(esize == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, base, 2, dims,
                      strides, box);
}
