# Data: token shards and the loader; the tokenizer against the npm package's JavaScript encoder.
loom_test(data SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data.c)
foreach(case sample random long)
  add_test(NAME tokenizer_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/tokenizer_tests.sh ${case} $<TARGET_FILE:loom>)
endforeach()
