loom_test(core SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_core.c)
