# Copies the consumer project to WORK_DIR with a link to this repository at vmm/, then
# configures, builds and runs it: vmm built as a subproject of someone else's project.
# Fails on the first step that does.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}/src")
file(COPY "${SOURCE_DIR}/CMakeLists.txt" "${MAIN_CPP}" DESTINATION "${WORK_DIR}/src")
file(CREATE_LINK "${VMM_SOURCE_DIR}" "${WORK_DIR}/src/vmm" SYMBOLIC)
foreach(step
    "${CMAKE_COMMAND};-S;${WORK_DIR}/src;-B;${WORK_DIR}/build;-G;${GENERATOR};-DCMAKE_BUILD_TYPE=Debug;-DCMAKE_CXX_COMPILER=${CXX_COMPILER};-DCUDAToolkit_ROOT=${CUDA_ROOT}"
    "${CMAKE_COMMAND};--build;${WORK_DIR}/build;--target;app"
    "${WORK_DIR}/build/app")
  execute_process(COMMAND ${step} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  message("${output}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "step failed (${result}): ${step}")
  endif()
endforeach()
