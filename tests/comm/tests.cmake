# Collectives: alone (the self backend) and under mpirun with 2, 3 and 4 ranks.
loom_test(comm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm.c)
foreach(np 2 3 4)
  loom_mpi_test(comm_np${np} ${np} test_comm)
endforeach()
# Collectives on device buffers staged through host memory, and NCCL's refusal of ranks that
# share a GPU (CUDA builds): alone and with 2 and 3 ranks, which share cuda:0 on a one-GPU
# machine. Without a CUDA device every rank exits 77 after MPI_Finalize; mpirun then exits 77
# too (the first non-zero status), which ctest reports as skipped.
if(LOOM_HAVE_CUDA)
  loom_test(comm_device SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm_device.c LABELS cuda)
  foreach(np 2 3)
    loom_mpi_test(comm_device_np${np} ${np} test_comm_device)
  endforeach()
  set_tests_properties(comm_device comm_device_np2 comm_device_np3 PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda)
endif()
