# The CUDA backend (src/backend/cuda): built when nvcc is found, and the build is then the same
# as without it plus the .cu files and the NCCL and staged comm backends in loomlib, LOOM_HAVE_CUDA
# defined, and cudart + cuBLASLt + NCCL linked. Without nvcc (or with -DLOOM_CUDA=OFF) nothing here changes the CPU build.
# Targets H100/H200: sm_90a machine code (wgmma, TMA; no PTX, so no JIT at start-up).
option(LOOM_CUDA "build the CUDA backend when nvcc is found" ON)
set(LOOM_HAVE_CUDA OFF)
if(NOT LOOM_CUDA)
  message(STATUS "CUDA backend: off (LOOM_CUDA=OFF)")
  return()
endif()

include(CheckLanguage)
# nvcc lives in /usr/local/cuda/bin on our machines, which is often not on PATH
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(ENV{CUDACXX} /usr/local/cuda/bin/nvcc)
endif()
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(STATUS "CUDA backend: off (no nvcc found; set CUDACXX to build it)")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90a-real) # -gencode arch=compute_90a,code=sm_90a
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(LOOM_HAVE_CUDA ON)
message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")

# The kernels as an object library folded into loomlib: loomlib's C flags (-march=native, the
# C warning set) are not nvcc flags, so the .cu files get their own.
file(GLOB LOOM_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backend/cuda/*.cu)
add_library(loom_cuda OBJECT ${LOOM_CUDA_SOURCES})
target_include_directories(loom_cuda PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_include_directories(loom_cuda SYSTEM PRIVATE ${UTHASH_INCLUDE_DIR})
target_compile_definitions(loom_cuda PRIVATE _GNU_SOURCE LOOM_HAVE_CUDA)
# warnings are errors: nvcc's own (--Werror all-warnings) and the host compiler's
# (C++20 for designated initializers; CMake 3.25 does not know nvcc 13's dialects, hence -std)
target_compile_options(loom_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
target_link_libraries(loom_cuda PRIVATE CUDA::cudart CUDA::cublasLt)

target_sources(loomlib PRIVATE $<TARGET_OBJECTS:loom_cuda> ${CMAKE_SOURCE_DIR}/src/comm/comm_nccl.c
               ${CMAKE_SOURCE_DIR}/src/comm/comm_staged.c)
# NCCL for collectives on device memory (src/comm/comm_nccl.c); it comes with the CUDA toolkit
# on our machines
find_library(NCCL_LIBRARY nccl REQUIRED HINTS ${CUDAToolkit_LIBRARY_DIR})
find_path(NCCL_INCLUDE_DIR nccl.h REQUIRED HINTS ${CUDAToolkit_INCLUDE_DIRS})
target_include_directories(loomlib PRIVATE ${NCCL_INCLUDE_DIR})
# loomlib was made before CUDA was enabled, so it did not pick up the architectures
set_target_properties(loomlib PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
target_compile_definitions(loomlib PUBLIC LOOM_HAVE_CUDA)
# nvcc's host objects may refer to the C++ runtime; loomlib's users link with the C driver
target_link_libraries(loomlib PUBLIC CUDA::cudart CUDA::cublasLt ${NCCL_LIBRARY} stdc++)
