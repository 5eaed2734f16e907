# CUDA: attention kernels (fwd, fwd+bwd TFLOP/s) beside bench/peer/attention_torch.py.
if(LOOM_HAVE_CUDA)
  add_executable(bench_attention ${CMAKE_CURRENT_LIST_DIR}/bench_attention.c)
  target_compile_options(bench_attention PRIVATE ${LOOM_WARNINGS})
  target_link_libraries(bench_attention PRIVATE loomlib)
endif()
# CUDA: the output layer's input-gradient product with the cross-entropy's backward in its
# prologue, beside cuBLASLt's (a design probe, bench/NOTES.md twenty-fifth session); built from
# its own sources, as sanitize_gemm_fp8 is, so that it keeps compiling against hopper.cuh.
if(LOOM_HAVE_CUDA)
  add_executable(bench_ce_gemm ${CMAKE_CURRENT_LIST_DIR}/bench_ce_gemm.cu
                 ${CMAKE_SOURCE_DIR}/src/backend/cuda/hopper.cu)
  target_include_directories(bench_ce_gemm PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(bench_ce_gemm PRIVATE -std=c++20 --Werror=all-warnings
                         -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror)
  target_link_libraries(bench_ce_gemm PRIVATE CUDA::cudart CUDA::cublasLt)
endif()
