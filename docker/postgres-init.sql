-- Databases of the stack, created once by the Postgres container's first start.
-- airflow: Airflow's metadata; leases: the lease store, the audit trail and the bridge's tables
-- (the lease store is its own database so task code never touches Airflow's); billing: the
-- example sink; temporal + temporal_visibility: the Temporal server's own persistence.
CREATE DATABASE airflow;
CREATE DATABASE leases;
CREATE DATABASE billing;
CREATE DATABASE temporal;
CREATE DATABASE temporal_visibility;
