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
# issue 14, the first hour of a user: install, help, wording, metrics, plots, TensorBoard, docs
foreach(case version_help wording metrics_resume plot tensorboard install docs_commands)
  add_test(NAME first_hour_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/first_hour_tests.sh ${case} $<TARGET_FILE:loom>
                   ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
loom_test(cli_eta SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_eta.c)
loom_test(cli_recompute SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_recompute.c)
# loom launch: restarts after a crash and a hang (2 ranks, bit-exact against an uninterrupted
# run), a stopped launcher, bad input
foreach(case crash hang stop bad_input)
  add_test(NAME launch_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/launch_tests.sh ${case} $<TARGET_FILE:loom>
                   ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# loom export: a Hugging Face folder whose transformers-style loss is loom's; bad input
foreach(case forward bad_input)
  add_test(NAME export_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/export_tests.sh ${case} $<TARGET_FILE:loom>
                   ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
