-- Taken by every example's "create the tables if missing" step, inside its transaction: two
-- runs creating the same schema or table at once would otherwise race in the catalog (one gets
-- a duplicate-key error from CREATE ... IF NOT EXISTS).
SELECT pg_advisory_xact_lock(hashtextextended('airflow_plugins.examples.schema', 0));
