-- The bridge's tables (schema bridge of the leases database), run by airflow-init as their
-- owner after migrate_bridge: the worker and tasks (runlease_task) record comparisons and read
-- modes; the pages (runlease_operator) change a cutover mode; readers read.
GRANT USAGE ON SCHEMA bridge TO runlease_task, runlease_operator, runlease_reader;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA bridge TO runlease_task;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA bridge TO runlease_task;
GRANT SELECT ON ALL TABLES IN SCHEMA bridge TO runlease_reader;
