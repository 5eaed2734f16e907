# The training step as a library: the step --cuda-graphs records (its ops issued directly on the
# CPU backend, which has no graphs) against the step launched op by op, bit for bit.
loom_test(step_graph SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_step_graph.c)
# The optimizer state file round trip, with and without FP8 delayed scaling's state.
loom_test(ckpt_state SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_state.c)
