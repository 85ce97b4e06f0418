-- The shadow route a business run was fixed with (whole: one Temporal shadow of the whole DAG;
-- task: a shadow per protected task), fixed by its first shadowed task like its mode, so a DAG
-- file changed mid-run cannot give one run both kinds of shadow. NULL: not shadowed (yet).
ALTER TABLE bridge.run_mode ADD COLUMN IF NOT EXISTS route text
    CHECK (route IN ('whole', 'task'));

-- A shadow run that finished and whose comparison waits (for the primary to finish, or for
-- Airflow's API), and why: what the Migration page and `bridge compare` show until the row is
-- stored in bridge.comparison (which removes this one).
CREATE TABLE IF NOT EXISTS bridge.comparison_wait (
    dag_id        text        NOT NULL,
    business_date text        NOT NULL,
    reason        text        NOT NULL,
    since         timestamptz NOT NULL DEFAULT now(),
    last_tried_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dag_id, business_date)
);
