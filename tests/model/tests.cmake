loom_test(gpt2_fixture SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt2_fixture.c
          ARGS ${CMAKE_SOURCE_DIR}/tests/fixtures)
loom_test(gpt2_train SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt2_train.c)
loom_test(param_table SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_param_table.c)
loom_test(gpt2_stage SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt2_stage.c)
