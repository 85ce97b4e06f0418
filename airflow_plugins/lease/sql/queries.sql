-- Named queries of the lease store and the sink fence, loaded once by
-- airflow_plugins.lease.queries. Every parameter is bound (%(name)s); nothing is formatted in.

-- name: acquire
-- The common case, a key with no row yet, in one plain statement: insert the lease (the token
-- drawn by the insert that wins the key) and its audit row. It returns no row when it did not
-- grant (the key has a row, a concurrent acquire inserted it first, or the date is refused):
-- the caller then asks acquire_decided. No plpgsql is named here, so a new backend's common
-- acquire loads no PL handler (measured: 0.75 ms less server CPU for each new connection).
WITH refused AS (
    SELECT %(business_date)s::date < current_date - %(horizon_days)s::integer
           OR %(business_date)s::date < (SELECT r.pruned_before FROM runlease.retention r)
           AS refused
), granted AS (
    INSERT INTO runlease.lease AS l (key, state, token, holder, attempt, business_date,
                                     acquired_at, expires_at)
    SELECT %(key)s::text, 'running', nextval('runlease.fencing_token'), %(holder)s::jsonb, 1,
           %(business_date)s::date, now(),
           now() + make_interval(secs => %(ttl_ms)s::integer / 1000.0)
    FROM refused
    WHERE refused.refused IS NOT TRUE
      -- a key that has a row (a duplicate, a retry) goes straight to the function, without
      -- drawing a token or attempting the insert; a row inserted concurrently meets the
      -- ON CONFLICT
      AND NOT EXISTS (SELECT FROM runlease.lease x WHERE x.key = %(key)s::text)
    ON CONFLICT ON CONSTRAINT lease_pkey DO NOTHING
    RETURNING l.token, l.attempt, l.expires_at
), audited AS (
    INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date, input,
                                outcome)
    SELECT %(key)s::text, 'acquire', g.token, %(holder)s::jsonb, g.attempt,
           %(business_date)s::date, %(input)s::jsonb, 'granted'
    FROM granted g
)
SELECT 'granted'::text AS outcome, g.token, g.attempt, NULL::jsonb AS holder, g.expires_at,
       NULL::jsonb AS result, NULL::jsonb AS previous_holder, NULL::bigint AS previous_token,
       NULL::text AS detail, true AS held_by_caller
FROM granted g;

-- name: acquire_decided
-- Every case the plain acquire did not grant, decided by runlease.acquire under the row lock
-- (a row inserted or deleted since is seen there). Same columns as acquire.
SELECT a.outcome, a.token, a.attempt,
       CASE WHEN a.holder = %(holder)s::jsonb THEN NULL ELSE a.holder END,
       a.expires_at, a.result, a.previous_holder, a.previous_token, a.detail,
       coalesce(a.holder = %(holder)s::jsonb, false)
FROM runlease.acquire(%(key)s::text, %(holder)s::jsonb, %(ttl_ms)s::integer,
                      %(business_date)s::date, %(horizon_days)s::integer,
                      %(input)s::jsonb) AS a;

-- name: acquire_batch
-- The caller's own holder is not sent back once per key (decoding it is most of the client's
-- cost of a large batch): held_by_caller says the row's holder is the caller.
SELECT b.key, b.outcome, b.token, b.attempt,
       CASE WHEN b.holder = %(holder)s::jsonb THEN NULL ELSE b.holder END AS holder,
       b.expires_at, b.result, b.previous_holder, b.previous_token, b.detail,
       coalesce(b.holder = %(holder)s::jsonb, false) AS held_by_caller
FROM runlease.acquire_batch(%(keys)s::text[], %(holder)s::jsonb, %(ttl_ms)s::integer,
                            %(business_date)s::date, %(horizon_days)s::integer) AS b
ORDER BY b.key;

-- name: renew
UPDATE runlease.lease
SET expires_at = now() + make_interval(secs => %(ttl_ms)s / 1000.0), renewed_at = now()
WHERE key = %(key)s AND token = %(token)s AND state = 'running'
RETURNING expires_at;

-- name: finish
-- Ends the holder's lease (succeeded, failed or released) and writes its audit row, in one
-- plain statement guarded by the token: a superseded holder changes nothing and gets no row.
-- The same call again (its answer was lost with a connection) finds its own finish and gets
-- that back, as runlease.finish does. The caller names its holder: key and token alone do not
-- finish a lease (a token read from a log), and the audit row is the holder's own.
WITH finished AS (
    UPDATE runlease.lease AS l
    SET state = %(state)s::text, finished_at = now(), result = %(result)s::jsonb,
        error = %(error)s::text
    WHERE l.key = %(key)s::text AND l.token = %(token)s::bigint AND l.state = 'running'
      AND l.holder = %(holder)s::jsonb
    RETURNING l.holder, l.attempt, l.business_date, l.finished_at,
              floor(extract(epoch FROM l.finished_at - l.acquired_at) * 1000)::bigint
              AS duration_ms
), audited AS (
    INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date, output,
                                duration_ms, outcome, reason)
    SELECT %(key)s::text,
           CASE %(state)s::text WHEN 'succeeded' THEN 'complete' WHEN 'failed' THEN 'fail'
                                ELSE 'release' END,
           %(token)s::bigint, f.holder, f.attempt, f.business_date, %(output)s::jsonb,
           f.duration_ms, %(state)s::text, %(error)s::text
    FROM finished f
)
SELECT f.finished_at, f.duration_ms FROM finished f
UNION ALL
SELECT l.finished_at, floor(extract(epoch FROM l.finished_at - l.acquired_at) * 1000)::bigint
FROM runlease.lease l
WHERE NOT EXISTS (SELECT FROM finished)
  AND l.key = %(key)s::text AND l.token = %(token)s::bigint AND l.state = %(state)s::text
  AND l.holder = %(holder)s::jsonb;

-- name: lease_generation
-- The re-run generation of the lease a holder was granted (0 until a re-run is approved).
SELECT generation FROM runlease.lease WHERE key = %(key)s AND token = %(token)s;

-- name: force_release
SELECT * FROM runlease.force_release(%(key)s, %(actor)s, %(reason)s);

-- name: approve_rerun
SELECT runlease.approve_rerun(%(key)s, %(business_date)s, %(actor)s, %(reason)s);

-- name: fail_on_behalf
SELECT * FROM runlease.fail_on_behalf(%(key)s, %(match)s, %(actor)s, %(reason)s);

-- name: fail_on_behalf_if_silent
-- runlease.fail_on_behalf, only when the lease has not been renewed (or, never renewed, was
-- acquired) more than %(silent_ms)s ago: its holder has missed its renewals. A holder that
-- still renews is left alone (its lease ends with its work, or by expiry).
WITH failed AS (
    UPDATE runlease.lease AS l
    SET state = 'failed', finished_at = now(), error = %(reason)s::text
    WHERE l.key = %(key)s::text AND l.state = 'running' AND l.holder @> %(match)s::jsonb
      AND coalesce(l.renewed_at, l.acquired_at)
          < now() - make_interval(secs => %(silent_ms)s::bigint / 1000.0)
    RETURNING l.*
)
SELECT f.token,
       runlease.record(f.key, 'fail_on_behalf', f.token, f.holder, f.attempt,
                       f.business_date, NULL, NULL,
                       floor(extract(epoch FROM now() - f.acquired_at) * 1000)::bigint,
                       'failed', %(actor)s::text, %(reason)s::text)
FROM failed f;

-- name: lock_key
-- Held to the end of the caller's transaction (LeaseStore.serialized); the lease row's own lock
-- is not used, so lease transitions never wait for an observer.
SELECT pg_advisory_xact_lock(hashtextextended('runlease.key:' || %(key)s::text, 0));

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
  AND (%(dags)s::text[] IS NULL OR split_part(key, '/', 1) = ANY(%(dags)s::text[]))
ORDER BY acquired_at DESC
LIMIT %(limit)s;

-- name: history
-- The dag and period parts of the key are implied by the key; spelled out, they let the
-- audit_dag_period index (dag, period, key, at) find the key's rows in time order.
SELECT id, at, key, event, token, holder, attempt, business_date, input, output,
       duration_ms, outcome, actor, reason
FROM runlease.audit
WHERE split_part(key, '/', 1) = split_part(%(key)s::text, '/', 1)
  AND split_part(key, '/', 3) COLLATE "C" = split_part(%(key)s::text, '/', 3) COLLATE "C"
  AND key = %(key)s::text
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

-- name: fence_begin
-- The first statement of a fenced transaction, all local to it: the session is ended if it
-- idles inside it, the fence advance waits at most %(lock)s, and the session's
-- application_name marks it as the holder of token N of one key (``runfence <key hash> N``),
-- so a newer holder blocked by it can find it and end it (fence_end_older_holders). Returns
-- the session's own lock_timeout, which the advance puts back for the caller's writes.
WITH prior AS MATERIALIZED (SELECT current_setting('lock_timeout') AS lock_timeout)
SELECT prior.lock_timeout,
       set_config('idle_in_transaction_session_timeout', %(idle)s, true),
       set_config('lock_timeout', %(lock)s, true),
       set_config('application_name', %(mark)s, true)
FROM prior;

-- name: fence_advance_bounded
-- fence_advance under fence_begin's lock_timeout; once it holds the row it restores the
-- session's lock_timeout (RETURNING runs after the row is locked), so the caller's own writes
-- wait on locks as they would have.
INSERT INTO runfence.fence AS f (key, token) VALUES (%(key)s, %(token)s)
ON CONFLICT (key) DO UPDATE SET token = excluded.token, advanced_at = now()
WHERE f.token <= excluded.token
RETURNING token, set_config('lock_timeout', %(prior_lock_timeout)s, true);

-- name: fence_end_older_holders
-- Ends the sessions of this key's older holders that are still inside a fenced transaction
-- (marked by fence_begin): a holder frozen inside a statement (mid-COPY, SIGSTOP) is "active",
-- so no idle timeout ends it, and it would block the newer holder's advance for as long as it
-- is frozen. Its transaction rolls back: it can no longer commit. Needs the sink role to be
-- the holders' own role or a member of pg_signal_backend. Waits %(wait_ms)s for each to exit.
-- Sessions of the same token (the holder's own other transactions) are listed, not ended
-- (ended is NULL for them).
SELECT a.pid,
       CASE WHEN m.token < %(token)s::bigint
            THEN pg_terminate_backend(a.pid, %(wait_ms)s::bigint) END AS ended
FROM pg_stat_activity a
CROSS JOIN LATERAL (
    SELECT CASE WHEN a.application_name ~ ('^runfence ' || %(mark)s::text || ' [0-9]{1,18}$')
                THEN split_part(a.application_name, ' ', 3)::bigint END AS token
) m
WHERE a.datname = current_database()
  AND a.pid <> pg_backend_pid()
  AND m.token <= %(token)s::bigint;

-- name: fence_current
SELECT token FROM runfence.fence WHERE key = %(key)s;

-- name: ledger_claim
-- One row per item that is newly claimed; an item already done under the key (in the
-- holder's generation: an approved re-run claims afresh) returns nothing.
INSERT INTO runfence.ledger (key, generation, item, token)
SELECT %(key)s, %(generation)s, item, %(token)s FROM unnest(%(items)s::text[]) AS item
ON CONFLICT (key, generation, item) DO NOTHING
RETURNING item;

-- name: ledger_done
SELECT item FROM runfence.ledger
WHERE key = %(key)s AND generation = %(generation)s AND item = ANY(%(items)s::text[]);

-- name: ledger_items
-- Every item done under the key in a generation, by any holder: what a taken-over run's
-- result describes.
SELECT item FROM runfence.ledger
WHERE key = %(key)s AND generation = %(generation)s ORDER BY item;

-- name: ledger_count
SELECT count(*) FROM runfence.ledger WHERE key = %(key)s AND generation = %(generation)s;

-- name: recent_audit_outcomes
-- Refused and blocked (held) acquires, newest first.
SELECT id, at, key, event, token, holder, attempt, business_date, outcome, reason
FROM runlease.audit
WHERE outcome = ANY(%(outcomes)s::text[])
  AND at >= now() - make_interval(hours => %(hours)s)
  AND (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
ORDER BY at DESC
LIMIT %(limit)s;

-- name: external_call_claim
-- The whole intended claim of a batch of items (one or more) in one statement, its own
-- transaction on an autocommit connection: the fence advanced to the holder's token under the
-- fence row's lock, as fence_advance_bounded does (waiting at most %(lock)s for the row; the
-- caller then ends older holders frozen in their fenced transactions and tries once more), then
-- each item claimed as intended (a new row, sends 1) or the intended row an earlier holder left
-- taken over (sends + 1: every claim is a send that may reach the processor). The token check
-- and the claims commit together or not at all: a superseded token (fenced false) claims
-- nothing. One row per item asked for, in the order asked (the items are distinct): state NULL
-- with fenced true is an item whose answer is recorded already (read it with
-- external_call_get); same_request: the intended row's request is this call's (an earlier
-- holder's must be).
WITH bounded AS MATERIALIZED (
    SELECT set_config('lock_timeout', %(lock)s, true) AS lock_timeout
), advanced AS (
    INSERT INTO runfence.fence AS f (key, token)
    SELECT %(key)s::text, %(token)s::bigint FROM bounded
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, advanced_at = now()
    WHERE f.token <= excluded.token
    RETURNING f.token
), wanted AS (
    SELECT w.item, w.idempotency_key, w.request, w.n
    FROM unnest(%(items)s::text[], %(idempotency_keys)s::text[], %(requests)s::jsonb[])
         WITH ORDINALITY AS w(item, idempotency_key, request, n)
), claimed AS (
    INSERT INTO runfence.external_call AS c (key, generation, item, idempotency_key, request,
                                             token, sends)
    SELECT %(key)s::text, %(generation)s::integer, w.item, w.idempotency_key, w.request,
           a.token, 1
    FROM advanced a, wanted w
    ORDER BY w.item
    ON CONFLICT (key, generation, item) DO UPDATE SET token = excluded.token, sends = c.sends + 1
    WHERE c.state = 'intended'
    RETURNING c.item, c.state, c.request, c.reference, c.answer, c.sends,
              extract(epoch FROM clock_timestamp() - c.intended_at)::float8 AS age_s
)
SELECT EXISTS (SELECT FROM advanced) AS fenced, w.item, c.state,
       c.request = w.request AS same_request, c.reference, c.answer, c.sends, c.age_s
FROM wanted w LEFT JOIN claimed c ON c.item = w.item
ORDER BY w.n;

-- name: external_call_get
SELECT state, request, reference, answer, sends,
       extract(epoch FROM clock_timestamp() - intended_at)::float8 AS age_s
FROM runfence.external_call
WHERE key = %(key)s AND generation = %(generation)s AND item = %(item)s;

-- name: external_call_answer
-- The answers' record of a batch of items (one or more) in one statement: fence_begin's
-- settings (the session is ended if it idles inside the transaction, marked as the key's
-- holder of its token, the advance bounded by %(lock)s), the fence advanced as
-- fence_advance_bounded does (restoring the session's lock_timeout once it holds the row, for
-- the caller's own writes after it), each processor answer recorded and its item claimed in
-- the ledger (done: never sent again). Alone on an autocommit connection it is its own
-- transaction; with the caller's writes it is the first statement of theirs. fenced false:
-- superseded, nothing written; an item missing from answered, with fenced true: its answer
-- was recorded already.
WITH begun AS MATERIALIZED (
    SELECT current_setting('lock_timeout') AS prior,
           set_config('idle_in_transaction_session_timeout', %(idle)s, true),
           set_config('lock_timeout', %(lock)s, true),
           set_config('application_name', %(mark)s, true)
), advanced AS (
    INSERT INTO runfence.fence AS f (key, token)
    SELECT %(key)s::text, %(token)s::bigint FROM begun
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, advanced_at = now()
    WHERE f.token <= excluded.token
    RETURNING f.token, set_config('lock_timeout', (SELECT b.prior FROM begun b), true)
), got AS (
    SELECT g.item, g.state, g.reference, g.answer
    FROM unnest(%(items)s::text[], %(states)s::text[], %(references)s::text[],
                %(answers)s::jsonb[]) AS g(item, state, reference, answer)
), answered AS (
    UPDATE runfence.external_call AS c
    SET state = g.state, reference = g.reference, answer = g.answer,
        token = a.token, answered_at = clock_timestamp()
    FROM advanced a, got g
    WHERE c.key = %(key)s::text AND c.generation = %(generation)s::integer
      AND c.item = g.item AND c.state = 'intended'
    RETURNING c.item
), done AS (
    INSERT INTO runfence.ledger (key, generation, item, token)
    SELECT %(key)s::text, %(generation)s::integer, n.item, %(token)s::bigint
    FROM answered n ORDER BY n.item
    ON CONFLICT (key, generation, item) DO NOTHING
    RETURNING item
)
SELECT EXISTS (SELECT FROM advanced) AS fenced,
       coalesce((SELECT array_agg(n.item) FROM answered n), '{}') AS answered,
       (SELECT count(*) FROM done) AS ledger_rows;

-- name: external_calls_of
-- The recorded external calls of some keys (the comparison, the demo).
SELECT key, item, idempotency_key, request, state, reference, sends
FROM runfence.external_call WHERE key = ANY(%(keys)s::text[]) ORDER BY key, generation, item;
