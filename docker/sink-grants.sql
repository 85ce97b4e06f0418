-- The example sink's privileges (database billing), run by airflow-init as its owner after the
-- fence migration. Tasks write their rows and advance the fence as runlease_task: they need the
-- fence and ledger (SELECT, INSERT, UPDATE) and the tables they write, never DDL or DELETE of
-- the ledger. Ending a frozen holder's session (the edges issue's fix) needs the same role as
-- that session or membership in pg_signal_backend: grant that to an operator role only.
GRANT USAGE ON SCHEMA runfence TO runlease_task;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA runfence TO runlease_task;
GRANT USAGE, CREATE ON SCHEMA public TO runlease_task;
GRANT SELECT ON ALL TABLES IN SCHEMA runfence TO runlease_reader;
