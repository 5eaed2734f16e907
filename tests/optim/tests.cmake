# The optimizer: AdamW with its per-step values in backend memory (what a recorded step runs)
# against the same steps with the values passed, bit for bit, on the CPU backend.
loom_test(adamw_scalars SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_adamw_scalars.c)
