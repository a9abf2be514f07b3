# RRef tests (owned by the RRef work): mpirpc_mpi_test(name nranks source) lines.
mpirpc_mpi_test(test_rref_scenarios 2 test_rref_scenarios.c)
add_test(NAME test_rref_scenarios_np3 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n 3 $<TARGET_FILE:test_rref_scenarios>)
add_test(NAME test_rref_scenarios_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n 4 $<TARGET_FILE:test_rref_scenarios>)
set_tests_properties(test_rref_scenarios_np2 test_rref_scenarios_np3 test_rref_scenarios_np4 PROPERTIES TIMEOUT 120)
mpirpc_mpi_test(test_rref_storm 4 test_rref_storm.c)
add_test(NAME test_rref_storm_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n 2 $<TARGET_FILE:test_rref_storm>)
set_tests_properties(test_rref_storm_np4 test_rref_storm_np2 PROPERTIES TIMEOUT 120)
mpirpc_mpi_test(test_rref_leak_report 2 test_rref_leak_report.c)
set_tests_properties(test_rref_leak_report_np2 PROPERTIES TIMEOUT 60)
mpirpc_mpi_test(test_rref_wire 2 test_rref_wire.c)
set_tests_properties(test_rref_wire_np2 PROPERTIES TIMEOUT 60)
# Graceful shutdown with RRefs in use: one scenario per run (test_shutdown_rrefs.c).
add_executable(test_shutdown_rrefs test_shutdown_rrefs.c)
target_link_libraries(test_shutdown_rrefs PRIVATE mpirpc PkgConfig::CMOCKA m)
target_include_directories(test_shutdown_rrefs PRIVATE ${PROJECT_SOURCE_DIR}/runtime ${PROJECT_SOURCE_DIR}/api/src
                           ${PROJECT_SOURCE_DIR}/tests/mpi)
target_compile_options(test_shutdown_rrefs PRIVATE ${MPIRPC_WARNINGS})
foreach(scenario_np observers:3 late_fork:2 stress:4)
  string(REPLACE ":" ";" parts ${scenario_np})
  list(GET parts 0 scenario)
  list(GET parts 1 np)
  add_test(NAME test_shutdown_rrefs_${scenario}_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n ${np} $<TARGET_FILE:test_shutdown_rrefs> ${scenario})
  set_tests_properties(test_shutdown_rrefs_${scenario}_np${np} PROPERTIES TIMEOUT 60)
endforeach()
# A user RRef swept by graceful shutdown while still PENDING (test_shutdown_pending_sweep.c).
mpirpc_mpi_test(test_shutdown_pending_sweep 3 test_shutdown_pending_sweep.c)
set_tests_properties(test_shutdown_pending_sweep_np3 PROPERTIES TIMEOUT 60)
# A late reply (its call timed out) carrying an RRef settles the RRef's fork.
mpirpc_mpi_test(test_rref_late_reply 2 test_rref_late_reply.c)
set_tests_properties(test_rref_late_reply_np2 PROPERTIES TIMEOUT 60 FAIL_REGULAR_EXPRESSION "RRef leak")
