# CPU backend: per-op time and rate at one GPT-2 124M layer, beside the machine's sgemm rate.
add_executable(bench_backend ${CMAKE_CURRENT_LIST_DIR}/bench_backend.c)
target_compile_options(bench_backend PRIVATE ${LOOM_WARNINGS})
target_link_libraries(bench_backend PRIVATE loomlib)
