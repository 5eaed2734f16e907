loom_test(core SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_core.c)
# core/power.c against a stand-in NVML library
add_library(fake_nvml SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_nvml.c)
loom_test(power SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_power.c)
target_compile_definitions(test_power PRIVATE FAKE_NVML="$<TARGET_FILE:fake_nvml>")
add_dependencies(test_power fake_nvml)
