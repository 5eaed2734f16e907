# CUDA: attention kernels (fwd, fwd+bwd TFLOP/s) beside bench/peer/attention_torch.py.
if(LOOM_HAVE_CUDA)
  add_executable(bench_attention ${CMAKE_CURRENT_LIST_DIR}/bench_attention.c)
  target_compile_options(bench_attention PRIVATE ${LOOM_WARNINGS})
  target_link_libraries(bench_attention PRIVATE loomlib)
endif()
# CUDA: the product probes (bench/NOTES.md), built from their own sources, as sanitize_gemm_fp8 is,
# so that they keep compiling against hopper.cuh:
# - bench_ce_gemm: the output layer's input-gradient product with the cross-entropy's backward in its
#   prologue, beside cuBLASLt's (twenty-fifth session);
# - bench_gemm_gelu: the MLP's GELU products in bf16 on a 128 x 256 tile of our own, beside cuBLASLt's
#   epilogues (twenty-eighth session).
if(LOOM_HAVE_CUDA)
  foreach(probe bench_ce_gemm bench_gemm_gelu)
    add_executable(${probe} ${CMAKE_CURRENT_LIST_DIR}/${probe}.cu ${CMAKE_SOURCE_DIR}/src/backend/cuda/hopper.cu)
    target_include_directories(${probe} PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_compile_options(${probe} PRIVATE -std=c++20 --Werror=all-warnings
                           -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror)
    target_link_libraries(${probe} PRIVATE CUDA::cudart CUDA::cublasLt)
  endforeach()
endif()
