"""fio: workload → job file (pure), fio output → typed results, and running fio."""
