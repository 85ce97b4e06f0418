#!/bin/sh
# Databases and roles of the stack, created once by the Postgres container's first start (the
# image runs this with the container's environment). Passwords are passed as psql variables,
# quoted by psql (:'name'), never on a command line.
#
# airflow: Airflow's metadata, owned by role airflow. leases: the lease store, the audit trail
# and the bridge's tables, and billing: the example sink, both owned by runlease_owner (which
# migrates them and runs `runlease maintain`); tasks connect as runlease_task, the pages as
# runlease_operator (the admin changes) and read-only tools as runlease_reader
# (airflow_plugins.lease.roles grants them, in airflow-init). temporal + temporal_visibility:
# Temporal's persistence, owned by role temporal. No service uses the superuser.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v airflow_pw="$AIRFLOW_DB_PASSWORD" -v temporal_pw="$TEMPORAL_DB_PASSWORD" \
    -v owner_pw="$RUNLEASE_OWNER_PASSWORD" -v task_pw="$RUNLEASE_TASK_PASSWORD" \
    -v operator_pw="$RUNLEASE_OPERATOR_PASSWORD" -v reader_pw="$RUNLEASE_READER_PASSWORD" <<'SQL'
CREATE ROLE airflow LOGIN PASSWORD :'airflow_pw';
CREATE ROLE temporal LOGIN CREATEDB PASSWORD :'temporal_pw';
CREATE ROLE runlease_owner LOGIN PASSWORD :'owner_pw';
CREATE ROLE runlease_task LOGIN PASSWORD :'task_pw';
CREATE ROLE runlease_operator LOGIN PASSWORD :'operator_pw';
CREATE ROLE runlease_reader LOGIN PASSWORD :'reader_pw';
CREATE DATABASE airflow OWNER airflow;
CREATE DATABASE leases OWNER runlease_owner;
CREATE DATABASE billing OWNER runlease_owner;
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;
REVOKE ALL ON DATABASE airflow, leases, billing, temporal, temporal_visibility FROM PUBLIC;
GRANT CONNECT ON DATABASE leases, billing TO runlease_task, runlease_operator, runlease_reader;
-- a scheduler killed alone leaves its executor workers holding its connection: the server ends
-- a session idle inside a transaction, so its row locks cannot block the other scheduler
-- (docs/operating.md, "A scheduler killed alone")
ALTER DATABASE airflow SET idle_in_transaction_session_timeout = '30s';
SQL
