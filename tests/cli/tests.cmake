foreach(case eval_fixture resume_bitexact kill_during_save bad_input tokenize)
  add_test(NAME cli_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_tests.sh ${case} $<TARGET_FILE:loom>
                   ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# bad input refused with one line: non-finite values, flag ranges, files that are not regular,
# checkpoint metadata, output errors, the folder's lock, orphaned ranks, messages (the leftovers of
# an interrupted save: cli_kill_during_save)
foreach(case nonfinite ranges not_regular ckpt_meta output_errors lock orphan messages)
  add_test(NAME cli_harden_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_harden.sh ${case} $<TARGET_FILE:loom>
                   ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
