-- Named queries of the bridge. Parameters are always bound.

-- name: mode_get
SELECT mode, version, changed_at, changed_by, reason FROM bridge.cutover WHERE dag_id = %(dag_id)s;

-- name: mode_list
SELECT dag_id, mode, version, changed_at, changed_by, reason FROM bridge.cutover ORDER BY dag_id;

-- name: mode_set
-- Compare-and-set on the version read: two operators changing one DAG at once cannot both win.
INSERT INTO bridge.cutover (dag_id, mode, version, changed_by, reason)
VALUES (%(dag_id)s, %(mode)s, 1, %(actor)s, %(reason)s)
ON CONFLICT (dag_id) DO UPDATE
    SET mode = excluded.mode, version = bridge.cutover.version + 1,
        changed_at = now(), changed_by = excluded.changed_by, reason = excluded.reason
    WHERE bridge.cutover.version = %(expected_version)s
RETURNING mode, version;

-- name: mode_fix_for_run
-- The first caller for a run fixes its mode; every later caller (a retry, another task, the
-- other engine) reads the same value back, even when the DAG's mode changed in between.
INSERT INTO bridge.run_mode (dag_id, run_id, mode)
SELECT %(dag_id)s, %(run_id)s,
       coalesce((SELECT mode FROM bridge.cutover WHERE dag_id = %(dag_id)s), 'airflow')
ON CONFLICT (dag_id, run_id) DO UPDATE SET mode = bridge.run_mode.mode
RETURNING mode;

-- name: route_fix_for_run
-- The first shadowed task of a run fixes its shadow route; later ones read it back.
UPDATE bridge.run_mode SET route = coalesce(route, %(route)s)
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
RETURNING route;

-- name: comparison_upsert
INSERT INTO bridge.comparison (
    dag_id, business_date, primary_engine, primary_status, primary_ms, primary_digests,
    primary_items, shadow_status, shadow_ms, shadow_digests, shadow_items, shadow_rows,
    differences, matched, primary_calls, shadow_calls, primary_tasks, shadow_tasks)
VALUES (%(dag_id)s, %(business_date)s, %(primary_engine)s, %(primary_status)s, %(primary_ms)s,
        %(primary_digests)s, %(primary_items)s, %(shadow_status)s, %(shadow_ms)s,
        %(shadow_digests)s, %(shadow_items)s, %(shadow_rows)s, %(differences)s, %(matched)s,
        %(primary_calls)s, %(shadow_calls)s, %(primary_tasks)s, %(shadow_tasks)s)
ON CONFLICT (dag_id, business_date) DO UPDATE SET
    primary_engine = excluded.primary_engine, primary_status = excluded.primary_status,
    primary_ms = excluded.primary_ms, primary_digests = excluded.primary_digests,
    primary_items = excluded.primary_items, shadow_status = excluded.shadow_status,
    shadow_ms = excluded.shadow_ms, shadow_digests = excluded.shadow_digests,
    shadow_items = excluded.shadow_items, shadow_rows = excluded.shadow_rows,
    differences = excluded.differences, matched = excluded.matched,
    primary_calls = excluded.primary_calls, shadow_calls = excluded.shadow_calls,
    primary_tasks = excluded.primary_tasks, shadow_tasks = excluded.shadow_tasks,
    compared_at = now();

-- name: comparison_wait_upsert
-- A finished shadow's comparison waits: why, since when (kept), last tried (now).
INSERT INTO bridge.comparison_wait (dag_id, business_date, reason)
VALUES (%(dag_id)s, %(business_date)s, %(reason)s)
ON CONFLICT (dag_id, business_date) DO UPDATE
    SET reason = excluded.reason, last_tried_at = now();

-- name: comparison_wait_clear
DELETE FROM bridge.comparison_wait WHERE dag_id = %(dag_id)s AND business_date = %(business_date)s;

-- name: comparison_waits
SELECT dag_id, business_date, reason, since, last_tried_at FROM bridge.comparison_wait
WHERE dag_id = %(dag_id)s
ORDER BY business_date DESC;

-- name: comparison_get
SELECT * FROM bridge.comparison WHERE dag_id = %(dag_id)s AND business_date = %(business_date)s;

-- name: comparison_recent
SELECT * FROM bridge.comparison
WHERE dag_id = %(dag_id)s AND shadow_status IS NOT NULL
ORDER BY business_date DESC
LIMIT %(limit)s;

-- name: lease_rows
-- The primary's side of a comparison: the lease rows of a run's task keys (a mapped task's
-- prefix would match its items' shadow keys too: never the shadow's own rows).
SELECT key, state, token, result, acquired_at, finished_at, error
FROM runlease.lease
WHERE (key = ANY(%(keys)s) OR key LIKE ANY(%(prefixes)s)) AND right(key, 7) <> '#shadow';

-- name: sink_ledger_items
SELECT key, item FROM runfence.ledger WHERE key = ANY(%(keys)s) ORDER BY key, item;

-- name: sink_external_calls
-- The primary's external calls (a sink without the external-call ledger has none).
SELECT key, item, idempotency_key, request, state, reference
FROM runfence.external_call WHERE key = ANY(%(keys)s) ORDER BY key, item;

-- name: sink_has_external_calls
SELECT to_regclass('runfence.external_call') IS NOT NULL;

-- name: sink_tables
-- The sink's own tables a shadow transaction may have written (the fence's are left out).
SELECT table_schema, table_name FROM information_schema.tables
WHERE table_type = 'BASE TABLE'
  AND table_schema NOT IN ('pg_catalog', 'information_schema', 'runfence')
ORDER BY table_schema, table_name;

-- name: rows_written_in_transaction
-- Rows this transaction inserted or updated: their xmin is this transaction's id. The table
-- name is an identifier composed by psycopg.sql; nothing else is formatted in.
SELECT to_jsonb(t) FROM {table} AS t
WHERE t.xmin::text::bigint = txid_current() %% 4294967296
LIMIT %(limit)s;

-- name: audit_mode_change
-- The change's audit row, in the same transaction as the change (runlease.record is the lease
-- store's own audit writer).
SELECT runlease.record(%(key)s, 'cutover_mode_changed', NULL, NULL, NULL, NULL,
                       %(input)s, %(output)s, NULL, %(mode)s, %(actor)s, %(reason)s);

-- name: comparison_insert_primary
-- A run with no shadow (Temporal primary): its side only, never over a compared row.
INSERT INTO bridge.comparison (dag_id, business_date, primary_engine, primary_status,
                               primary_ms, primary_digests)
VALUES (%(dag_id)s, %(business_date)s, 'temporal', %(primary_status)s, %(primary_ms)s,
        %(primary_digests)s)
ON CONFLICT (dag_id, business_date) DO NOTHING;
