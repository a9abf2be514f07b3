# check_include_blocked.cmake — proves that a layer cannot include a higher layer's internal header.
# Compiles a real source file of the layer (-fsyntax-only) with exactly that layer's include folders
# and definitions twice: as it is (must compile: the flags are complete), and with
# `#include "<FORBIDDEN>"` put in front (must fail, and the error must name FORBIDDEN).
# The copies live in WORK, so the source's own folder gives no extra lookup.
# Usage: cmake -DCC=<C compiler> -DSOURCE=<layer .c file> -DFORBIDDEN=<header>
#              -DINCLUDES=<dir|dir...> -DDEFINES=<def|def...> -DWORK=<scratch dir> -P check_include_blocked.cmake
foreach(v CC SOURCE FORBIDDEN INCLUDES WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_include_blocked: -D${v}= missing")
  endif()
endforeach()
string(REPLACE "|" ";" include_dirs "${INCLUDES}")
string(REPLACE "|" ";" defines "${DEFINES}")
set(flags -std=gnu11 -fsyntax-only)
foreach(d IN LISTS include_dirs)
  list(APPEND flags "-I${d}")
endforeach()
foreach(d IN LISTS defines)
  if(d)
    list(APPEND flags "-D${d}")
  endif()
endforeach()
get_filename_component(base "${SOURCE}" NAME_WE)
string(MAKE_C_IDENTIFIER "${FORBIDDEN}" tag)
file(MAKE_DIRECTORY "${WORK}")
file(READ "${SOURCE}" text)
set(clean "${WORK}/${base}_as_is.c")
set(bad "${WORK}/${base}_with_${tag}.c")
file(WRITE "${clean}" "${text}")
file(WRITE "${bad}" "#include \"${FORBIDDEN}\"\n${text}")

execute_process(COMMAND ${CC} ${flags} "${clean}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the layer's own source ${SOURCE} does not compile with the layer's flags "
                      "(${flags}):\n${out}${err}")
endif()
execute_process(COMMAND ${CC} ${flags} "${bad}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "LAYER VIOLATION COMPILES: ${SOURCE} with #include \"${FORBIDDEN}\" "
                      "compiled with the layer's flags (${flags})")
endif()
string(REPLACE "." "\\." forbidden_re "${FORBIDDEN}")
if(NOT "${err}${out}" MATCHES "${forbidden_re}")
  message(FATAL_ERROR "the compile failed, but not on ${FORBIDDEN}:\n${out}${err}")
endif()
message(STATUS "blocked as expected: ${SOURCE} + #include \"${FORBIDDEN}\":\n${err}")
