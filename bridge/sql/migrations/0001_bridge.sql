-- Bridge, version 1: cutover modes per DAG, the mode each run was fixed with, and the
-- side-by-side comparison of the two engines' runs. Lives in the lease store's database.

CREATE SCHEMA IF NOT EXISTS bridge;

-- The current cutover mode of each DAG (no row: airflow). Changed only by the CLI, audited in
-- runlease.audit under the DAG's key.
CREATE TABLE IF NOT EXISTS bridge.cutover (
    dag_id      text        PRIMARY KEY,
    mode        text        NOT NULL
                CHECK (mode IN ('airflow', 'shadow', 'temporal', 'temporal-scheduled')),
    version     integer     NOT NULL DEFAULT 1,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    changed_by  text        NOT NULL,
    reason      text        NOT NULL
);

-- The mode a run was fixed with when it started: a later change applies to the next run.
CREATE TABLE IF NOT EXISTS bridge.run_mode (
    dag_id      text        NOT NULL,
    run_id      text        NOT NULL,
    mode        text        NOT NULL,
    fixed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dag_id, run_id)
);

-- One row per business run compared: both engines' side and the differences.
CREATE TABLE IF NOT EXISTS bridge.comparison (
    dag_id          text        NOT NULL,
    business_date   text        NOT NULL,
    primary_engine  text        NOT NULL,
    primary_status  text,
    primary_ms      bigint,
    primary_digests jsonb       NOT NULL DEFAULT '{}',
    primary_items   jsonb       NOT NULL DEFAULT '{}',
    shadow_status   text,
    shadow_ms       bigint,
    shadow_digests  jsonb       NOT NULL DEFAULT '{}',
    shadow_items    jsonb       NOT NULL DEFAULT '{}',
    shadow_rows     jsonb       NOT NULL DEFAULT '{}',
    differences     jsonb       NOT NULL DEFAULT '[]',
    matched         boolean,
    compared_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dag_id, business_date)
);
CREATE INDEX IF NOT EXISTS comparison_recent ON bridge.comparison (dag_id, compared_at DESC);
