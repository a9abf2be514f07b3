# RRef tests (owned by the RRef work): mpirpc_mpi_test(name nranks source) lines.
