# The README's tour program, extracted at build time, built with the project's warnings and run
# on 2 ranks: the tour in README.md cannot stop compiling or working unnoticed.
set(MPIRPC_TOUR_C ${CMAKE_CURRENT_BINARY_DIR}/readme_tour.c)
add_custom_command(OUTPUT ${MPIRPC_TOUR_C}
  COMMAND ${CMAKE_COMMAND} -DREADME=${PROJECT_SOURCE_DIR}/README.md -DOUT=${MPIRPC_TOUR_C}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/extract_readme_tour.cmake
  DEPENDS ${PROJECT_SOURCE_DIR}/README.md ${CMAKE_CURRENT_SOURCE_DIR}/extract_readme_tour.cmake
  COMMENT "Extracting the README tour")
mpirpc_mpi_test(readme_tour 2 ${MPIRPC_TOUR_C})
# The tour checks little itself, as tours do: it returns mpr_shutdown's code, and any failure it or
# the library prints ("add failed: ...", a one-way call's "... failed: MPR_ERR_...") fails the test.
set_tests_properties(readme_tour_np2 PROPERTIES TIMEOUT 60 FAIL_REGULAR_EXPRESSION "failed|MPR_ERR_")
# The README's first command runs apps/demo_rpc on 2 ranks: it must keep working. The demo
# prints call errors on purpose ("errors: ..."); a failed step prints "demo: ... failed" and
# exits non-zero, a failed one-way call prints "one-way call ... failed".
if(TARGET demo_rpc)
  add_test(NAME demo_rpc_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n 2 $<TARGET_FILE:demo_rpc>)
  set_tests_properties(demo_rpc_np2 PROPERTIES TIMEOUT 60 FAIL_REGULAR_EXPRESSION "demo: |one-way call .* failed")
endif()
