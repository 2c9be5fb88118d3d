# Finds the CUTLASS/CuTe headers (header-only; no CUTLASS sources live in this
# repo). Order: -DCUTLASS_DIR, then $CUTLASS_DIR, then the nvidia-cutlass
# Python package, whose wheel ships them under cutlass_library/source/include.
# Sets FLASHTILE_CUTLASS_INCLUDE_DIR. Used by flashtile's build and, installed
# beside flashtileConfig.cmake, by projects that find_package(flashtile); with
# FLASHTILE_CUTLASS_OPTIONAL set, a miss leaves it empty and sets
# FLASHTILE_CUTLASS_NOT_FOUND_MESSAGE instead of stopping the configure.
include_guard(GLOBAL)

set(CUTLASS_DIR "" CACHE PATH "CUTLASS checkout or install prefix (holds include/cute)")
if(NOT CUTLASS_DIR AND DEFINED ENV{CUTLASS_DIR})
  set(CUTLASS_DIR "$ENV{CUTLASS_DIR}")
endif()

set(_flashtile_cutlass_candidates "")
if(CUTLASS_DIR)
  list(APPEND _flashtile_cutlass_candidates "${CUTLASS_DIR}/include" "${CUTLASS_DIR}")
else()
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    # find_spec locates the package without importing (running) it.
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c
              "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source', 'include') if s else '')"
      OUTPUT_VARIABLE _flashtile_wheel_include
      OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET)
    if(_flashtile_wheel_include)
      list(APPEND _flashtile_cutlass_candidates "${_flashtile_wheel_include}")
    endif()
  endif()
endif()

set(FLASHTILE_CUTLASS_INCLUDE_DIR "")
foreach(_dir IN LISTS _flashtile_cutlass_candidates)
  if(EXISTS "${_dir}/cute/tensor.hpp" AND EXISTS "${_dir}/cutlass/cutlass.h")
    set(FLASHTILE_CUTLASS_INCLUDE_DIR "${_dir}")
    break()
  endif()
endforeach()

if(NOT FLASHTILE_CUTLASS_INCLUDE_DIR)
  string(CONCAT FLASHTILE_CUTLASS_NOT_FOUND_MESSAGE
    "flashtile: CUTLASS/CuTe headers not found (looked in: '${_flashtile_cutlass_candidates}').\n"
    "Provide them one of these ways:\n"
    "  pip install nvidia-cutlass          (the wheel ships the headers; needs the same Python)\n"
    "  cmake -DCUTLASS_DIR=/path/to/cutlass   or   export CUTLASS_DIR=/path/to/cutlass\n"
    "where the path holds include/cute/tensor.hpp.")
  if(FLASHTILE_CUTLASS_OPTIONAL)  # set by flashtileConfig.cmake: find_package reports it
    return()
  endif()
  message(FATAL_ERROR "${FLASHTILE_CUTLASS_NOT_FOUND_MESSAGE}")
endif()
message(STATUS "flashtile: CUTLASS headers: ${FLASHTILE_CUTLASS_INCLUDE_DIR}")
