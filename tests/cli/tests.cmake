foreach(case eval_fixture resume_bitexact kill_during_save bad_input tokenize)
  add_test(NAME cli_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_tests.sh ${case} $<TARGET_FILE:loom>
                   ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
