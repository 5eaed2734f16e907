# CPU backend: ops against fp64 references, finite-difference gradients, accumulation
# semantics, AdamW, sumsq, thread-count independence, and the vocabulary-parallel ops against
# the whole-vocabulary ones.
set(BACKEND_DIR ${CMAKE_CURRENT_LIST_DIR})
loom_test(backend_forward SOURCES ${BACKEND_DIR}/test_backend_forward.c ${BACKEND_DIR}/ref.c)
loom_test(backend_backward SOURCES ${BACKEND_DIR}/test_backend_backward.c ${BACKEND_DIR}/ref.c)
loom_test(backend_gradcheck SOURCES ${BACKEND_DIR}/test_backend_gradcheck.c)
loom_test(backend_optim SOURCES ${BACKEND_DIR}/test_backend_optim.c)
loom_test(backend_threads SOURCES ${BACKEND_DIR}/test_backend_threads.c)
loom_test(backend_vocab SOURCES ${BACKEND_DIR}/test_backend_vocab.c ${BACKEND_DIR}/ref.c)
loom_test(backend_attention_blocks SOURCES ${BACKEND_DIR}/test_backend_attention_blocks.c ${BACKEND_DIR}/ref.c)
# expf/tanhf of the CPU kernels under UBSan: NaN and infinities without undefined behaviour
loom_test(cpu_math SOURCES ${BACKEND_DIR}/test_cpu_math.c)
target_compile_options(test_cpu_math PRIVATE -fsanitize=undefined,float-cast-overflow -fno-sanitize-recover=all)
target_link_options(test_cpu_math PRIVATE -fsanitize=undefined,float-cast-overflow)
