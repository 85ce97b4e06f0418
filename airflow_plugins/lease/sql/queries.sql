-- Named queries of the lease store and the sink fence, loaded once by
-- airflow_plugins.lease.queries. Every parameter is bound (%(name)s); nothing is formatted in.

-- name: acquire
SELECT * FROM runlease.acquire(%(key)s, %(holder)s, %(ttl_ms)s, %(business_date)s,
                               %(horizon_days)s, %(input)s);

-- name: acquire_batch
-- The caller's own holder is not sent back once per key (decoding it is most of the client's
-- cost of a large batch): held_by_caller says the row's holder is the caller.
SELECT b.key, b.outcome, b.token, b.attempt,
       CASE WHEN b.holder = %(holder)s THEN NULL ELSE b.holder END AS holder,
       coalesce(b.holder = %(holder)s, false) AS held_by_caller,
       b.expires_at, b.result, b.previous_holder, b.previous_token, b.detail
FROM runlease.acquire_batch(%(keys)s, %(holder)s, %(ttl_ms)s, %(business_date)s,
                            %(horizon_days)s) AS b
ORDER BY b.key;

-- name: renew
UPDATE runlease.lease
SET expires_at = now() + make_interval(secs => %(ttl_ms)s / 1000.0), renewed_at = now()
WHERE key = %(key)s AND token = %(token)s AND state = 'running'
RETURNING expires_at;

-- name: finish
SELECT * FROM runlease.finish(%(key)s, %(token)s, %(state)s, %(result)s, %(output)s,
                              %(error)s);

-- name: force_release
SELECT * FROM runlease.force_release(%(key)s, %(actor)s, %(reason)s);

-- name: approve_rerun
SELECT runlease.approve_rerun(%(key)s, %(business_date)s, %(actor)s, %(reason)s);

-- name: fail_on_behalf
SELECT * FROM runlease.fail_on_behalf(%(key)s, %(match)s, %(actor)s, %(reason)s);

-- name: record
SELECT runlease.record(%(key)s, %(event)s, %(token)s, %(holder)s, %(attempt)s,
                       %(business_date)s, %(input)s, %(output)s, %(duration_ms)s,
                       %(outcome)s, %(actor)s, %(reason)s);

-- name: get_lease
SELECT key, state, token, holder, attempt, business_date, acquired_at, expires_at,
       renewed_at, finished_at, result, error, takeovers, rerun_approved,
       (state = 'running' AND expires_at < now()) AS expired
FROM runlease.lease WHERE key = %(key)s;

-- name: list_leases
SELECT key, state, token, holder, attempt, business_date, acquired_at, expires_at,
       renewed_at, finished_at, result, error, takeovers, rerun_approved,
       (state = 'running' AND expires_at < now()) AS expired
FROM runlease.lease
WHERE (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (NOT %(expired_only)s::boolean OR (state = 'running' AND expires_at < now()))
  AND (NOT %(taken_over_only)s::boolean OR takeovers > 0)
ORDER BY acquired_at DESC
LIMIT %(limit)s;

-- name: history
SELECT id, at, key, event, token, holder, attempt, business_date, input, output,
       duration_ms, outcome, actor, reason
FROM runlease.audit
WHERE key = %(key)s
ORDER BY at, id;

-- name: audit_by_date
SELECT id, at, key, event, token, holder, attempt, business_date, input, output,
       duration_ms, outcome, actor, reason
FROM runlease.audit
WHERE business_date = %(business_date)s
  AND (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
  AND (%(outcome)s::text IS NULL OR outcome = %(outcome)s::text)
ORDER BY at, id
LIMIT %(limit)s;

-- name: ensure_audit_partitions
SELECT runlease.ensure_audit_partitions(%(from)s, %(until)s);

-- name: prune
SELECT * FROM runlease.prune(%(horizon_days)s, %(audit_keep_months)s);

-- name: fence_advance
-- Raises the key's fence to the holder's token; no row comes back when a higher token is there.
INSERT INTO runfence.fence AS f (key, token) VALUES (%(key)s, %(token)s)
ON CONFLICT (key) DO UPDATE SET token = excluded.token, advanced_at = now()
WHERE f.token <= excluded.token
RETURNING token;

-- name: fence_current
SELECT token FROM runfence.fence WHERE key = %(key)s;

-- name: ledger_claim
-- One row per item that is newly claimed; an item already done under the key returns nothing.
INSERT INTO runfence.ledger (key, item, token)
SELECT %(key)s, item, %(token)s FROM unnest(%(items)s::text[]) AS item
ON CONFLICT (key, item) DO NOTHING
RETURNING item;

-- name: ledger_done
SELECT item FROM runfence.ledger WHERE key = %(key)s AND item = ANY(%(items)s::text[]);

-- name: ledger_count
SELECT count(*) FROM runfence.ledger WHERE key = %(key)s;

-- name: recent_audit_outcomes
-- Refused and blocked (held) acquires, newest first.
SELECT id, at, key, event, token, holder, attempt, business_date, outcome, reason
FROM runlease.audit
WHERE outcome = ANY(%(outcomes)s::text[])
  AND at >= now() - make_interval(hours => %(hours)s)
  AND (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
ORDER BY at DESC
LIMIT %(limit)s;
