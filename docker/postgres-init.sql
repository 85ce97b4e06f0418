-- Databases of the stack, created once by the Postgres container's first start.
-- airflow: Airflow's metadata; leases: the lease store, the audit trail and the bridge's tables
-- (the lease store is its own database so task code never touches Airflow's); billing: the
-- example sink; temporal + temporal_visibility: the Temporal server's own persistence.
CREATE DATABASE airflow;
CREATE DATABASE leases;
CREATE DATABASE billing;
CREATE DATABASE temporal;
CREATE DATABASE temporal_visibility;
-- a scheduler killed alone leaves its executor workers holding its connection: the server ends
-- a session idle inside a transaction, so its row locks cannot block the other scheduler
-- (docs/operating.md, "A scheduler killed alone")
ALTER DATABASE airflow SET idle_in_transaction_session_timeout = '30s';
