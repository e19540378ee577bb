# hyper_ac._memory: pybind11 module linked against LibTorch's c10 only.
#
# Included from the top-level CMakeLists.txt inside its Python section, where
# Python (Interpreter) and pybind11 are already found.  Uses the torch wheel
# installed for ${Python_EXECUTABLE}: its headers and libc10.so, with the same
# libstdc++ ABI flag.  Without an importable torch the module is skipped with a
# warning and hyper_ac.memory.is_available() reports False.
#
# Inputs (all optional): HYPER_AC_TORCH_DIR -- the torch package directory
# (defaults to the one ${Python_EXECUTABLE} imports).

if(NOT HYPER_AC_TORCH_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import os, torch; print(os.path.dirname(torch.__file__), end='')"
    OUTPUT_VARIABLE HYPER_AC_TORCH_DIR
    RESULT_VARIABLE _hyper_ac_torch_rc
    ERROR_QUIET)
  if(NOT _hyper_ac_torch_rc EQUAL 0)
    set(HYPER_AC_TORCH_DIR "")
  endif()
  set(HYPER_AC_TORCH_DIR "${HYPER_AC_TORCH_DIR}" CACHE PATH "torch package directory for _memory")
endif()

set(_hyper_ac_c10_include "${HYPER_AC_TORCH_DIR}/include")
set(_hyper_ac_c10_lib "${HYPER_AC_TORCH_DIR}/lib/libc10${CMAKE_SHARED_LIBRARY_SUFFIX}")

if(NOT HYPER_AC_TORCH_DIR OR NOT EXISTS "${_hyper_ac_c10_include}/c10/core/CPUAllocator.h"
   OR NOT EXISTS "${_hyper_ac_c10_lib}")
  message(WARNING "hyper_ac: torch (c10 headers + libc10) not found for ${Python_EXECUTABLE}; "
                  "skipping the _memory module")
else()
  # The wheel's libstdc++ ABI (std::string / std::list layout in c10 headers).
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI), end='')"
    OUTPUT_VARIABLE _hyper_ac_torch_abi
    RESULT_VARIABLE _hyper_ac_abi_rc
    ERROR_QUIET)
  if(NOT _hyper_ac_abi_rc EQUAL 0 OR NOT _hyper_ac_torch_abi MATCHES "^[01]$")
    message(FATAL_ERROR "hyper_ac: could not read torch._C._GLIBCXX_USE_CXX11_ABI")
  endif()

  pybind11_add_module(_memory "${CMAKE_CURRENT_LIST_DIR}/memory_module.cc")
  # SYSTEM: torch's headers are not ours to warn about.
  target_include_directories(_memory SYSTEM PRIVATE "${_hyper_ac_c10_include}")
  target_compile_definitions(_memory PRIVATE _GLIBCXX_USE_CXX11_ABI=${_hyper_ac_torch_abi})
  target_compile_options(_memory PRIVATE -Wall -Wextra)
  target_link_libraries(_memory PRIVATE "${_hyper_ac_c10_lib}")
  # hyper_ac.memory imports torch first, which already loads libc10; the RPATH
  # makes a bare `import hyper_ac._memory` work too.
  set_target_properties(_memory PROPERTIES
    BUILD_RPATH "${HYPER_AC_TORCH_DIR}/lib"
    INSTALL_RPATH "${HYPER_AC_TORCH_DIR}/lib")
  install(TARGETS _memory LIBRARY DESTINATION hyper_ac)
  message(STATUS "hyper_ac: _memory links ${_hyper_ac_c10_lib} (_GLIBCXX_USE_CXX11_ABI=${_hyper_ac_torch_abi})")
endif()
