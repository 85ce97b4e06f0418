-- The per-task sides of a whole-DAG shadow's comparison (an ordinary DAG): for each task, its
-- state, duration and XCom digests (every key), as Airflow's REST API reported them and as the
-- Temporal shadow ran them.
ALTER TABLE bridge.comparison ADD COLUMN IF NOT EXISTS primary_tasks jsonb NOT NULL DEFAULT '{}';
ALTER TABLE bridge.comparison ADD COLUMN IF NOT EXISTS shadow_tasks jsonb NOT NULL DEFAULT '{}';
