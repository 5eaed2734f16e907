# Collectives: alone (the self backend) and under mpirun with 2, 3 and 4 ranks.
loom_test(comm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm.c)
foreach(np 2 3 4)
  loom_mpi_test(comm_np${np} ${np} test_comm)
endforeach()
