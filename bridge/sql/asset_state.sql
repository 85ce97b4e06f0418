-- The asset state store's queries (bridge.worker.asset_state). Parameters are always bound.

-- name: asset_state_get
SELECT value FROM bridge.asset_state
WHERE mode = %(mode)s AND asset = %(asset)s AND key = %(key)s;

-- name: asset_state_set
INSERT INTO bridge.asset_state
    (mode, asset, key, value, updated_by_dag_id, updated_by_run_id, updated_by_task_id)
VALUES (%(mode)s, %(asset)s, %(key)s, %(value)s, %(dag_id)s, %(run_id)s, %(task_id)s)
ON CONFLICT (mode, asset, key) DO UPDATE
    SET value = excluded.value, updated_at = now(),
        updated_by_dag_id = excluded.updated_by_dag_id,
        updated_by_run_id = excluded.updated_by_run_id,
        updated_by_task_id = excluded.updated_by_task_id;

-- name: asset_state_delete
DELETE FROM bridge.asset_state WHERE mode = %(mode)s AND asset = %(asset)s AND key = %(key)s;

-- name: asset_state_clear
DELETE FROM bridge.asset_state WHERE mode = %(mode)s AND asset = %(asset)s;
