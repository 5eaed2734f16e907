# Data: tokenizer encode speed (MB/s) on one core and all cores.
add_executable(bench_tokenizer ${CMAKE_CURRENT_LIST_DIR}/bench_tokenizer.c)
target_compile_options(bench_tokenizer PRIVATE ${LOOM_WARNINGS})
target_link_libraries(bench_tokenizer PRIVATE loomlib)
