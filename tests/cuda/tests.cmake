# CUDA backend: every op against the CPU backend in fp32 and bf16 mode (attention, with its blocks
# at offsets and their merge, and the FP8 products of precision fp8, in programs of their own).
# (cmake/cuda.cmake found nvcc); on a machine without a CUDA device the programs exit 77, which
# ctest reports as skipped.
if(LOOM_HAVE_CUDA)
  foreach(t cuda_backend cuda_attention cuda_fp8)
    loom_test(${t} SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_${t}.c ${CMAKE_CURRENT_LIST_DIR}/../backend/ref.c LABELS cuda)
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endforeach()
endif()
# gemm_fp8.cu's kernel alone, the program racecheck runs (scripts/device_gpu.sh): built from its own
# sources, not loomlib, so that no cuBLASLt kernel runs beside it under the sanitizer.
if(LOOM_HAVE_CUDA)
  add_executable(sanitize_gemm_fp8 ${CMAKE_CURRENT_LIST_DIR}/sanitize_gemm_fp8.cu
                 ${CMAKE_SOURCE_DIR}/src/backend/cuda/gemm_fp8.cu ${CMAKE_SOURCE_DIR}/src/backend/cuda/hopper.cu)
  target_include_directories(sanitize_gemm_fp8 PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_options(sanitize_gemm_fp8 PRIVATE -std=c++20 --Werror=all-warnings
                         -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror -lineinfo)
  target_link_libraries(sanitize_gemm_fp8 PRIVATE CUDA::cudart)
  add_test(NAME sanitize_gemm_fp8 COMMAND sanitize_gemm_fp8)
  set_tests_properties(sanitize_gemm_fp8 PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda)
endif()
# The PyTorch fixtures of the model on the GPU: fp32 as tight as the CPU, bf16 loose.
if(LOOM_HAVE_CUDA)
  foreach(precision fp32 bf16)
    add_test(NAME gpt2_fixture_cuda_${precision}
             COMMAND test_gpt2_fixture ${CMAKE_SOURCE_DIR}/tests/fixtures cuda ${precision})
    set_tests_properties(gpt2_fixture_cuda_${precision} PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda)
  endforeach()
endif()
# The whole model on the GPU against the CPU (loss and every gradient), tiny and gpt2, fp32 and bf16.
if(LOOM_HAVE_CUDA)
  loom_test(gpt2_devices SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt2_devices.c LABELS cuda)
  set_tests_properties(gpt2_devices PROPERTIES SKIP_RETURN_CODE 77)
endif()
# Every kernel begins with cuda_pdl_begin() (programmatic dependent launch's contract): a source
# check, so it runs without a GPU too.
add_test(NAME cuda_pdl_first COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/pdl_first.sh ${CMAKE_SOURCE_DIR}/src/backend/cuda)
# bf16 training on the GPU killed and resumed ends bit-identical to the whole run (the split master
# weights saved and cut again; whole ones; ZeRO 1 on 2 ranks sharing the GPU).
if(LOOM_HAVE_CUDA)
  add_test(NAME resume_gpu COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/resume_gpu.sh $<TARGET_FILE:loom>
                                   ${CMAKE_SOURCE_DIR}/tests/fixtures ${MPIEXEC_EXECUTABLE})
  set_tests_properties(resume_gpu PROPERTIES SKIP_RETURN_CODE 77 LABELS cuda ENVIRONMENT
                       "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1")
endif()
