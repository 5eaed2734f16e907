# Data parallelism: the engine under mpirun with synthetic buffers, and training parity.
loom_test(dp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dp.c)
foreach(np 2 3 4)
  loom_mpi_test(dp_np${np} ${np} test_dp)
endforeach()
add_executable(compare_models ${CMAKE_CURRENT_LIST_DIR}/compare_models.c)
target_compile_options(compare_models PRIVATE ${LOOM_WARNINGS})
target_link_libraries(compare_models PRIVATE loomlib)
foreach(case parity resume errors bench_comm bench)
  add_test(NAME dp_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/dp_tests.sh ${case} $<TARGET_FILE:loom>
                   $<TARGET_FILE:compare_models> ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# Tensor and sequence parallelism: the training library on a mesh against the one-process run
# (losses every step, step-1 gradients), under mpirun: ranks tp sp zero
add_executable(test_tp ${CMAKE_CURRENT_LIST_DIR}/test_tp.c)
target_compile_options(test_tp PRIVATE ${LOOM_WARNINGS})
target_include_directories(test_tp PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(test_tp PRIVATE loomlib)
foreach(layout "2 2 0 0" "2 2 1 0" "4 4 0 0" "4 4 1 0" "4 2 0 1" "4 2 1 2" "6 2 1 0" "8 4 1 1" "8 2 0 2")
  separate_arguments(args UNIX_COMMAND "${layout}")
  list(GET args 0 np)
  list(GET args 1 tp)
  list(GET args 2 sp)
  list(GET args 3 zero)
  loom_mpi_test(tp_np${np}_tp${tp}_sp${sp}_zero${zero} ${np} test_tp ${tp} ${sp} ${zero} ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# The mesh's groups and coordinates
add_executable(test_mesh ${CMAKE_CURRENT_LIST_DIR}/test_mesh.c)
target_compile_options(test_mesh PRIVATE ${LOOM_WARNINGS})
target_include_directories(test_mesh PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(test_mesh PRIVATE loomlib)
loom_mpi_test(mesh_np8 8 test_mesh)
# `loom train --tp` end to end: parity, resume, errors, sampling
foreach(case parity resume errors sample)
  add_test(NAME tp_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/tp_tests.sh ${case} $<TARGET_FILE:loom>
                   $<TARGET_FILE:compare_models> ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# Pipeline schedules: the action lists of every schedule, the simulator's checks (broken lists
# refused), bubbles against their closed forms; `loom schedule` output and its errors
loom_test(pp_schedule SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pp_schedule.c)
foreach(case timeline errors)
  add_test(NAME schedule_${case} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/schedule_tests.sh ${case} $<TARGET_FILE:loom>)
endforeach()
# `loom train --pp` end to end: every schedule's parity (pp 2 and 4, pp x tp x dp), resume, errors
foreach(case parity resume errors)
  add_test(NAME pp_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/pp_tests.sh ${case} $<TARGET_FILE:loom>
                   $<TARGET_FILE:compare_models> ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# ZeRO 3's parameter + gradient + AdamW bytes per rank against 1/N of one process's + the units in
# flight, on the backend's counters; `loom train --zero 3` (FSDP) and `--dp-replicate` (HSDP):
# parity at 1-4 ranks and with tp and pp, resume, errors
add_executable(test_fsdp ${CMAKE_CURRENT_LIST_DIR}/test_fsdp.c)
target_compile_options(test_fsdp PRIVATE ${LOOM_WARNINGS})
target_include_directories(test_fsdp PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(test_fsdp PRIVATE loomlib)
foreach(np 2 4)
  loom_mpi_test(fsdp_memory_np${np} ${np} test_fsdp)
endforeach()
foreach(case parity resume errors)
  add_test(NAME fsdp_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/fsdp_tests.sh ${case} $<TARGET_FILE:loom>
                   $<TARGET_FILE:compare_models> ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# `loom train --cp` (context parallelism, ring and Ulysses): parity at cp 2 and 4 and with tp, pp and
# ZeRO 1-3, T = 2048 from a fresh --max-seq 2048 model, resume, errors
foreach(case parity long resume errors)
  add_test(NAME cp_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cp_tests.sh ${case} $<TARGET_FILE:loom>
                   $<TARGET_FILE:compare_models> ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
# A checkpoint resumed over other data-parallel degrees: ranks, ZeRO stage, replicas, buckets
foreach(case dp fsdp tp_cp mesh errors)
  add_test(NAME reshard_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/reshard_tests.sh ${case} $<TARGET_FILE:loom>
                   $<TARGET_FILE:compare_models> ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
