-- The asset state store of the tasks the bridge's worker runs (Airflow 3.3's
-- context["asset_state_store"]): key/value state of one asset, kept across runs and DAGs, as
-- Airflow keeps it on the asset. Keyed by the engine's role too (primary / shadow), so a shadow
-- run reads and writes its own state and never the primary's. Airflow's own rows stay in
-- Airflow's metadata DB: neither engine reads the other's.
CREATE TABLE IF NOT EXISTS bridge.asset_state (
    mode text NOT NULL CHECK (mode IN ('primary', 'shadow')),
    asset text NOT NULL,
    key text NOT NULL,
    value jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by_dag_id text,
    updated_by_run_id text,
    updated_by_task_id text,
    PRIMARY KEY (mode, asset, key)
);
