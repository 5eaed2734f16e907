# CUDA: attention kernels (fwd, fwd+bwd TFLOP/s) beside bench/peer/attention_torch.py.
if(LOOM_HAVE_CUDA)
  add_executable(bench_attention ${CMAKE_CURRENT_LIST_DIR}/bench_attention.c)
  target_compile_options(bench_attention PRIVATE ${LOOM_WARNINGS})
  target_link_libraries(bench_attention PRIVATE loomlib)
endif()
