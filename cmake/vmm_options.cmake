# Warnings and sanitizers, applied to every target of the project (not exported).
add_library(vmm_build_flags INTERFACE)
# -Wno-missing-field-initializers: option structs are meant for designated initializers.
target_compile_options(vmm_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-missing-field-initializers>
  $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror,-Wno-missing-field-initializers>)

if(VMM_SANITIZE AND VMM_TSAN)
  message(FATAL_ERROR "VMM_SANITIZE and VMM_TSAN cannot be combined")
endif()
if(VMM_FUZZ AND VMM_TSAN)
  message(FATAL_ERROR "VMM_FUZZ (AddressSanitizer) and VMM_TSAN cannot be combined")
endif()
# The fuzz targets (tests/fuzz/) link libFuzzer; the code they fuzz is compiled with its
# coverage instrumentation (fuzzer-no-link) and the same sanitizers, so that coverage and
# ASan reports reach into the library.
if(VMM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "VMM_FUZZ needs clang with libFuzzer (${CMAKE_CXX_COMPILER_ID} found): "
                        "configure a separate build with -DCMAKE_CXX_COMPILER=clang++, "
                        "as scripts/fuzz.sh does")
  endif()
  target_compile_options(vmm_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer>)
  target_link_options(vmm_build_flags INTERFACE -fsanitize=address,undefined)
endif()
if(VMM_SANITIZE)
  target_compile_options(vmm_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer>)
  target_link_options(vmm_build_flags INTERFACE -fsanitize=address,undefined)
endif()
if(VMM_TSAN)
  target_compile_options(vmm_build_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
  target_link_options(vmm_build_flags INTERFACE -fsanitize=thread)
endif()
install(TARGETS vmm_build_flags EXPORT vmmTargets)
