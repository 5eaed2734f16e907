# Data parallelism: the engine under mpirun with synthetic buffers, and training parity.
loom_test(dp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dp.c)
foreach(np 2 3 4)
  loom_mpi_test(dp_np${np} ${np} test_dp)
endforeach()
add_executable(compare_models ${CMAKE_CURRENT_LIST_DIR}/compare_models.c)
target_compile_options(compare_models PRIVATE ${LOOM_WARNINGS})
target_link_libraries(compare_models PRIVATE loomlib)
foreach(case parity resume errors bench_comm)
  add_test(NAME dp_${case}
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/dp_tests.sh ${case} $<TARGET_FILE:loom>
                   $<TARGET_FILE:compare_models> ${CMAKE_SOURCE_DIR}/tests/fixtures)
endforeach()
