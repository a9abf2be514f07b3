# RRef tests (owned by the RRef work): mpirpc_mpi_test(name nranks source) lines.
mpirpc_mpi_test(test_rref_scenarios 2 test_rref_scenarios.c)
add_test(NAME test_rref_scenarios_np3 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n 3 $<TARGET_FILE:test_rref_scenarios>)
add_test(NAME test_rref_scenarios_np4 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n 4 $<TARGET_FILE:test_rref_scenarios>)
set_tests_properties(test_rref_scenarios_np2 test_rref_scenarios_np3 test_rref_scenarios_np4 PROPERTIES TIMEOUT 120)
mpirpc_mpi_test(test_rref_storm 4 test_rref_storm.c)
add_test(NAME test_rref_storm_np2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIRPC_MPIEXEC_FLAGS} -n 2 $<TARGET_FILE:test_rref_storm>)
set_tests_properties(test_rref_storm_np4 test_rref_storm_np2 PROPERTIES TIMEOUT 120)
