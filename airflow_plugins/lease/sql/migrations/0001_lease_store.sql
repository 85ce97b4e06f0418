-- Lease store, version 1: run-leases with fencing tokens, the audit trail and retention.
-- Applied by airflow_plugins.lease.migrations inside one transaction together with the version
-- bump, under an advisory lock, so two processes migrating at once apply it exactly once.

CREATE SCHEMA IF NOT EXISTS runlease;

-- One sequence for every key: a token is drawn only after the row it guards is locked, so a
-- key's tokens rise in commit order. Sequences never go backwards, crash recovery included.
CREATE SEQUENCE IF NOT EXISTS runlease.fencing_token AS bigint;

-- The lease of one business identity ("billing_nightly/charge/2024-02-15").
-- A succeeded row is also the compact record acquire reads for the retention horizon.
CREATE TABLE IF NOT EXISTS runlease.lease (
    key             text        PRIMARY KEY
                    CHECK (char_length(key) BETWEEN 1 AND 512),
    state           text        NOT NULL
                    CHECK (state IN ('running', 'succeeded', 'failed', 'released')),
    token           bigint      NOT NULL,
    holder          jsonb       NOT NULL,
    attempt         integer     NOT NULL CHECK (attempt >= 0),
    business_date   date,
    acquired_at     timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    renewed_at      timestamptz,
    finished_at     timestamptz,
    result          jsonb,
    error           text,
    takeovers       integer     NOT NULL DEFAULT 0,
    -- set by an audited administrative override: the next acquire of a succeeded key is granted
    rerun_approved  boolean     NOT NULL DEFAULT false
) WITH (fillfactor = 90);
-- Every index on this table is paid by every acquire and every finish, so each one is here for a
-- query that needs it, and none holds expires_at: a renew (and a takeover) then changes no
-- indexed column and is a HOT update, written in place on its page (fillfactor leaves room).
-- Running leases (the views' live leases, the listener failing a try's leases): a few among
-- millions of finished rows. Keyed by key, not expires_at, so a renew stays HOT.
CREATE INDEX IF NOT EXISTS lease_running ON runlease.lease (key) WHERE state = 'running';
-- One DAG's leases over a range of business periods (the watcher's gap detection, the views):
-- keys are dag/task/period[/map]; periods are ISO text, so byte order is time order.
CREATE INDEX IF NOT EXISTS lease_dag_period ON runlease.lease
    (split_part(key, '/', 1), (split_part(key, '/', 3) COLLATE "C"));
-- No index on business_date: only prune (a daily batch) filters on it; its sequential scan
-- costs seconds a day, where the index would cost every acquire and every finish.

-- Every transition and every refused or blocked acquire, written in the transaction that made
-- it. Partitioned by month so old months are dropped whole; the default partition keeps a row
-- whose month has no partition yet (ensure_audit_partitions moves such rows out).
CREATE TABLE IF NOT EXISTS runlease.audit (
    id              bigint      GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    key             text        NOT NULL,
    event           text        NOT NULL,
    token           bigint,
    holder          jsonb,
    attempt         integer,
    business_date   date,
    input           jsonb,
    output          jsonb,
    duration_ms     bigint,
    outcome         text,
    actor           text,
    reason          text,
    PRIMARY KEY (at, id)
) PARTITION BY RANGE (at);
CREATE TABLE IF NOT EXISTS runlease.audit_default PARTITION OF runlease.audit DEFAULT;
-- Two indexes besides the primary key (at, id: the views' recent hours), each paid by every
-- transition. One key's history and one DAG's rows over a range of periods ("did dag X run
-- for date D, exactly once?" on a peak day of millions of rows) share one index: a key's
-- history names its dag and period too (queries.sql: history), so a separate (key, at) index
-- would only duplicate this one.
CREATE INDEX IF NOT EXISTS audit_dag_period ON runlease.audit
    (split_part(key, '/', 1), (split_part(key, '/', 3) COLLATE "C"), key, at);
-- The audit of one business date, whatever its keys look like (audit_by_date).
CREATE INDEX IF NOT EXISTS audit_business_date ON runlease.audit (business_date, key);

-- Keys whose lease rows were pruned are refused by their business date: below this floor the
-- store no longer knows whether the work was done.
CREATE TABLE IF NOT EXISTS runlease.retention (
    singleton       boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    pruned_before   date        NOT NULL,
    pruned_at       timestamptz NOT NULL
);

CREATE OR REPLACE FUNCTION runlease.audit_partition_name(p_month date) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'audit_' || to_char(p_month, 'YYYY_MM')
$$;

-- Creates the monthly partitions from p_from to p_until, moving rows the default partition
-- holds for such a month into it. Idempotent.
CREATE OR REPLACE FUNCTION runlease.ensure_audit_partitions(p_from date, p_until date)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_month date := date_trunc('month', p_from)::date;
    v_name  text;
    v_made  integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('runlease.ensure_audit_partitions'));
    WHILE v_month <= p_until LOOP
        v_name := runlease.audit_partition_name(v_month);
        IF to_regclass('runlease.' || v_name) IS NULL THEN
            CREATE TEMP TABLE IF NOT EXISTS runlease_audit_moving
                (LIKE runlease.audit) ON COMMIT DROP;
            WITH moved AS (
                DELETE FROM runlease.audit_default
                WHERE at >= v_month AND at < (v_month + interval '1 month')
                RETURNING *
            )
            INSERT INTO runlease_audit_moving SELECT * FROM moved;
            EXECUTE format(
                'CREATE TABLE runlease.%I PARTITION OF runlease.audit FOR VALUES FROM (%L) TO (%L)',
                v_name, v_month, (v_month + interval '1 month')::date);
            INSERT INTO runlease.audit OVERRIDING SYSTEM VALUE
                SELECT * FROM runlease_audit_moving;
            TRUNCATE runlease_audit_moving;
            v_made := v_made + 1;
        END IF;
        v_month := (v_month + interval '1 month')::date;
    END LOOP;
    RETURN v_made;
END;
$$;

SELECT runlease.ensure_audit_partitions(
    (date_trunc('month', now()) - interval '1 month')::date,
    (date_trunc('month', now()) + interval '3 months')::date);

-- Writes one audit row. Inputs and outputs arrive already masked and size-limited by the client.
-- plpgsql, not sql: a sql function's INSERT is planned again on every call, plpgsql keeps the
-- plan for the session (this is on the path of every transition).
CREATE OR REPLACE FUNCTION runlease.record(
    p_key text, p_event text, p_token bigint, p_holder jsonb, p_attempt integer,
    p_business_date date, p_input jsonb, p_output jsonb, p_duration_ms bigint,
    p_outcome text, p_actor text, p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date, input,
                                output, duration_ms, outcome, actor, reason)
    VALUES (p_key, p_event, p_token, p_holder, p_attempt, p_business_date, p_input,
            p_output, p_duration_ms, p_outcome, p_actor, p_reason);
END;
$$;

-- The acquire of one key, decided under the key's row lock. Outcomes:
--   granted      no live holder: a new token (first grant, retry after failure or release,
--                or a re-run an administrator approved)
--   taken_over   the holder's lease expired: a new, higher token; the old holder is recorded
--   held         a live holder has it: who and until when
--   succeeded    already done: the recorded result, nothing is granted
--   refused      no row and the business date is older than the retention horizon or the
--                prune floor: the store cannot know whether it was done, so it never guesses
CREATE OR REPLACE FUNCTION runlease.acquire(
    p_key text, p_holder jsonb, p_ttl_ms integer, p_business_date date,
    p_horizon_days integer, p_input jsonb)
RETURNS TABLE (outcome text, token bigint, attempt integer, holder jsonb,
               expires_at timestamptz, result jsonb, previous_holder jsonb,
               previous_token bigint, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    v_row   runlease.lease%ROWTYPE;
    v_floor date;
    v_ttl   interval := make_interval(secs => p_ttl_ms / 1000.0);
BEGIN
    LOOP
        SELECT * INTO v_row FROM runlease.lease l WHERE l.key = p_key FOR UPDATE;
        EXIT WHEN FOUND;

        IF p_business_date IS NOT NULL THEN
            SELECT r.pruned_before INTO v_floor FROM runlease.retention r;
            IF p_business_date < current_date - p_horizon_days
               OR (v_floor IS NOT NULL AND p_business_date < v_floor) THEN
                detail := format('business date %s is older than the retention horizon '
                                 '(%s days) and the store holds no record of it; an '
                                 'administrator can approve it with an override',
                                 p_business_date, p_horizon_days);
                PERFORM runlease.record(p_key, 'acquire', NULL, p_holder, NULL,
                    p_business_date, p_input, NULL, NULL, 'refused', NULL, detail);
                outcome := 'refused';
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;

        INSERT INTO runlease.lease AS l (key, state, token, holder, attempt, business_date,
                                         acquired_at, expires_at)
        VALUES (p_key, 'running', nextval('runlease.fencing_token'), p_holder, 1,
                p_business_date, now(), now() + v_ttl)
        ON CONFLICT ON CONSTRAINT lease_pkey DO NOTHING
        RETURNING l.token, l.attempt, l.expires_at INTO token, attempt, expires_at;
        IF FOUND THEN
            PERFORM runlease.record(p_key, 'acquire', token, p_holder, attempt,
                p_business_date, p_input, NULL, NULL, 'granted', NULL, NULL);
            outcome := 'granted';
            holder := p_holder;
            RETURN NEXT;
            RETURN;
        END IF;
        -- a concurrent acquire inserted the key first: lock its row and decide again
    END LOOP;

    -- The same holder asking again (its first answer was lost with a connection): the lease is
    -- still its own, so it is handed back, renewed, with the same token.
    IF v_row.state = 'running' AND v_row.holder = p_holder THEN
        UPDATE runlease.lease AS l SET expires_at = now() + v_ttl, renewed_at = now()
        WHERE l.key = p_key;
        RETURN QUERY SELECT 'granted'::text, v_row.token, v_row.attempt, v_row.holder,
            now() + v_ttl, NULL::jsonb, NULL::jsonb, NULL::bigint,
            'already held by this holder'::text;
        RETURN;
    END IF;

    IF v_row.state = 'running' AND v_row.expires_at >= now() THEN
        PERFORM runlease.record(p_key, 'acquire', v_row.token, p_holder, v_row.attempt,
            v_row.business_date, p_input, NULL, NULL, 'held', NULL,
            'held until ' || v_row.expires_at);
        RETURN QUERY SELECT 'held'::text, v_row.token, v_row.attempt, v_row.holder,
            v_row.expires_at, NULL::jsonb, NULL::jsonb, NULL::bigint, NULL::text;
        RETURN;
    END IF;

    IF v_row.state = 'succeeded' AND NOT v_row.rerun_approved THEN
        PERFORM runlease.record(p_key, 'acquire', v_row.token, p_holder, v_row.attempt,
            v_row.business_date, p_input, NULL, NULL, 'succeeded', NULL,
            'already succeeded at ' || v_row.finished_at);
        RETURN QUERY SELECT 'succeeded'::text, v_row.token, v_row.attempt, v_row.holder,
            v_row.expires_at, v_row.result, NULL::jsonb, NULL::bigint, NULL::text;
        RETURN;
    END IF;

    outcome := CASE WHEN v_row.state = 'running' THEN 'taken_over' ELSE 'granted' END;
    UPDATE runlease.lease AS l
    SET state = 'running', token = nextval('runlease.fencing_token'), holder = p_holder,
        attempt = l.attempt + 1, acquired_at = now(), expires_at = now() + v_ttl,
        renewed_at = NULL, finished_at = NULL, result = NULL, error = NULL,
        takeovers = l.takeovers + (outcome = 'taken_over')::integer,
        rerun_approved = false,
        business_date = coalesce(p_business_date, l.business_date)
    WHERE l.key = p_key
    RETURNING l.token, l.attempt, l.expires_at INTO token, attempt, expires_at;
    holder := p_holder;
    IF outcome = 'taken_over' THEN
        previous_holder := v_row.holder;
        previous_token := v_row.token;
        detail := 'took over from token ' || v_row.token || ', expired at ' || v_row.expires_at;
    ELSIF v_row.state = 'succeeded' THEN
        detail := 're-run approved by an administrator';
    ELSE
        detail := 'previous attempt ' || v_row.state;
    END IF;
    PERFORM runlease.record(p_key, 'acquire', token, p_holder, attempt,
        coalesce(p_business_date, v_row.business_date), p_input, NULL, NULL, outcome,
        NULL, detail);
    RETURN NEXT;
END;
$$;

-- Ends a holder's lease: complete (succeeded), fail (failed) or release (released).
-- Guarded by the token: a holder that was superseded changes nothing and learns it (no row).
CREATE OR REPLACE FUNCTION runlease.finish(
    p_key text, p_token bigint, p_state text, p_result jsonb, p_output jsonb, p_error text)
RETURNS TABLE (finished_at timestamptz, duration_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_row runlease.lease%ROWTYPE;
BEGIN
    UPDATE runlease.lease AS l
    SET state = p_state, finished_at = now(), result = p_result, error = p_error
    WHERE l.key = p_key AND l.token = p_token AND l.state = 'running'
    RETURNING l.* INTO v_row;
    IF NOT FOUND THEN
        -- the same call again (its answer was lost): report the finish it already made
        RETURN QUERY SELECT l.finished_at,
            floor(extract(epoch FROM l.finished_at - l.acquired_at) * 1000)::bigint
            FROM runlease.lease l
            WHERE l.key = p_key AND l.token = p_token AND l.state = p_state;
        RETURN;
    END IF;
    finished_at := v_row.finished_at;
    duration_ms := floor(extract(epoch FROM v_row.finished_at - v_row.acquired_at) * 1000);
    PERFORM runlease.record(p_key,
        CASE p_state WHEN 'succeeded' THEN 'complete' WHEN 'failed' THEN 'fail' ELSE 'release' END,
        p_token, v_row.holder, v_row.attempt, v_row.business_date, NULL, p_output, duration_ms,
        p_state, NULL, p_error);
    RETURN NEXT;
END;
$$;

-- Administrative changes: each needs an actor and a reason, and is audited with both.
CREATE OR REPLACE FUNCTION runlease.require_reason(p_actor text, p_reason text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(btrim(p_actor), '') = '' OR coalesce(btrim(p_reason), '') = '' THEN
        RAISE EXCEPTION 'an administrative change needs an actor and a reason'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

-- Releases a running lease whoever holds it. The holder's next renew fails, so it stops; its
-- token stays valid at sinks only until the next holder advances their fences.
CREATE OR REPLACE FUNCTION runlease.force_release(p_key text, p_actor text, p_reason text)
RETURNS TABLE (token bigint, holder jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_row runlease.lease%ROWTYPE;
BEGIN
    PERFORM runlease.require_reason(p_actor, p_reason);
    UPDATE runlease.lease AS l
    SET state = 'released', finished_at = now(), error = 'force-released by ' || p_actor
    WHERE l.key = p_key AND l.state = 'running'
    RETURNING l.* INTO v_row;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM runlease.record(p_key, 'force_release', v_row.token, v_row.holder, v_row.attempt,
        v_row.business_date, NULL, NULL, NULL, 'released', p_actor, p_reason);
    RETURN QUERY SELECT v_row.token, v_row.holder;
END;
$$;

-- Approves one more run of a key: a succeeded key is granted again once; a key with no record
-- (older than the retention horizon) gets one, so its acquire is no longer refused.
CREATE OR REPLACE FUNCTION runlease.approve_rerun(
    p_key text, p_business_date date, p_actor text, p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_row runlease.lease%ROWTYPE;
BEGIN
    PERFORM runlease.require_reason(p_actor, p_reason);
    SELECT * INTO v_row FROM runlease.lease l WHERE l.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO runlease.lease (key, state, token, holder, attempt, business_date,
                                    acquired_at, expires_at, finished_at, error)
        VALUES (p_key, 'released', nextval('runlease.fencing_token'),
                jsonb_build_object('engine', 'admin', 'actor', p_actor), 0,
                p_business_date, now(), now(), now(), 'approved by ' || p_actor)
        ON CONFLICT ON CONSTRAINT lease_pkey DO NOTHING;
    ELSIF v_row.state = 'running' THEN
        RAISE EXCEPTION 'lease % is running (token %): force-release it first', p_key, v_row.token
            USING ERRCODE = 'object_in_use';
    ELSIF v_row.state = 'succeeded' THEN
        UPDATE runlease.lease l SET rerun_approved = true WHERE l.key = p_key;
    ELSE
        RETURN 'not_needed';
    END IF;
    PERFORM runlease.record(p_key, 'approve_rerun', v_row.token, v_row.holder, v_row.attempt,
        coalesce(p_business_date, v_row.business_date), NULL, NULL, NULL, 'approved',
        p_actor, p_reason);
    RETURN 'approved';
END;
$$;

-- Fails the running lease of a named try on its behalf (the listener, when Airflow reports the
-- try failed). p_match must be contained in the holder: {"run_id": ..., "try_number": 2}.
CREATE OR REPLACE FUNCTION runlease.fail_on_behalf(
    p_key text, p_match jsonb, p_actor text, p_reason text)
RETURNS TABLE (token bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_row runlease.lease%ROWTYPE;
BEGIN
    PERFORM runlease.require_reason(p_actor, p_reason);
    UPDATE runlease.lease AS l
    SET state = 'failed', finished_at = now(), error = p_reason
    WHERE l.key = p_key AND l.state = 'running' AND l.holder @> p_match
    RETURNING l.* INTO v_row;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM runlease.record(p_key, 'fail_on_behalf', v_row.token, v_row.holder, v_row.attempt,
        v_row.business_date, NULL, NULL,
        floor(extract(epoch FROM now() - v_row.acquired_at) * 1000)::bigint,
        'failed', p_actor, p_reason);
    RETURN QUERY SELECT v_row.token;
END;
$$;

-- Drops whole audit months older than p_keep_months and lease rows finished before the
-- horizon; raises the prune floor so their keys are refused, not granted again.
CREATE OR REPLACE FUNCTION runlease.prune(p_horizon_days integer, p_audit_keep_months integer)
RETURNS TABLE (dropped_partitions integer, pruned_leases bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_part  record;
    v_floor date := current_date - p_horizon_days;
    v_cut   date := (date_trunc('month', now()) - make_interval(months => p_audit_keep_months))::date;
BEGIN
    dropped_partitions := 0;
    FOR v_part IN
        SELECT c.relname FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE i.inhparent = 'runlease.audit'::regclass AND n.nspname = 'runlease'
          AND c.relname ~ '^audit_[0-9]{4}_[0-9]{2}$'
          AND to_date(substr(c.relname, 7), 'YYYY_MM') < v_cut
    LOOP
        EXECUTE format('DROP TABLE runlease.%I', v_part.relname);
        dropped_partitions := dropped_partitions + 1;
    END LOOP;
    DELETE FROM runlease.lease l
    WHERE l.state <> 'running' AND l.business_date < v_floor;
    GET DIAGNOSTICS pruned_leases = ROW_COUNT;
    INSERT INTO runlease.retention (pruned_before, pruned_at) VALUES (v_floor, now())
    ON CONFLICT (singleton) DO UPDATE
    SET pruned_before = greatest(runlease.retention.pruned_before, excluded.pruned_before),
        pruned_at = excluded.pruned_at;
    RETURN NEXT;
END;
$$;

-- Acquires many keys for one holder in one round trip and one transaction (fanned-out work:
-- per-tenant tasks). Set-based for the common case: every key that has no row yet is inserted
-- (token drawn per inserted row, as in acquire) and audited by one statement each; only keys
-- that already have a row (or a date the retention check refuses) go through acquire one by
-- one. Both steps take keys in sorted order, so concurrent batches cannot deadlock; a key a
-- concurrent transaction inserts first is waited for and then decided by acquire.
CREATE OR REPLACE FUNCTION runlease.acquire_batch(
    p_keys text[], p_holder jsonb, p_ttl_ms integer, p_business_date date,
    p_horizon_days integer)
RETURNS TABLE (key text, outcome text, token bigint, attempt integer, holder jsonb,
               expires_at timestamptz, result jsonb, previous_holder jsonb,
               previous_token bigint, detail text)
LANGUAGE plpgsql AS $$
DECLARE
    v_key     text;
    v_floor   date;
    v_ttl     interval := make_interval(secs => p_ttl_ms / 1000.0);
    v_new     text[] := '{}';
    v_tokens  bigint[] := '{}';
BEGIN
    IF p_business_date IS NOT NULL THEN
        SELECT r.pruned_before INTO v_floor FROM runlease.retention r;
    END IF;
    -- a refused date inserts nothing: acquire refuses (and audits) each key below
    IF p_business_date IS NULL
       OR NOT (p_business_date < current_date - p_horizon_days
               OR (v_floor IS NOT NULL AND p_business_date < v_floor)) THEN
        WITH wanted AS (
            SELECT DISTINCT w.k FROM unnest(p_keys) AS w(k) ORDER BY w.k
        ), inserted AS (
            INSERT INTO runlease.lease AS l (key, state, token, holder, attempt, business_date,
                                             acquired_at, expires_at)
            SELECT w.k, 'running', nextval('runlease.fencing_token'), p_holder, 1,
                   p_business_date, now(), now() + v_ttl
            FROM wanted w ORDER BY w.k
            ON CONFLICT ON CONSTRAINT lease_pkey DO NOTHING
            RETURNING l.key, l.token
        ), audited AS (
            INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date,
                                        outcome)
            SELECT i.key, 'acquire', i.token, p_holder, 1, p_business_date, 'granted'
            FROM inserted i ORDER BY i.key
        )
        SELECT coalesce(array_agg(i.key ORDER BY i.key), '{}'),
               coalesce(array_agg(i.token ORDER BY i.key), '{}')
        INTO v_new, v_tokens
        FROM inserted i;
    END IF;
    RETURN QUERY
        SELECT n.k, 'granted'::text, n.t, 1, p_holder, now() + v_ttl, NULL::jsonb,
               NULL::jsonb, NULL::bigint, NULL::text
        FROM unnest(v_new, v_tokens) AS n(k, t);
    FOR v_key IN
        SELECT r.k FROM (SELECT w.k FROM unnest(p_keys) AS w(k)
                         EXCEPT SELECT n.k FROM unnest(v_new) AS n(k)) r
        ORDER BY r.k
    LOOP
        RETURN QUERY SELECT v_key, a.* FROM runlease.acquire(
            v_key, p_holder, p_ttl_ms, p_business_date, p_horizon_days, NULL) a;
    END LOOP;
END;
$$;
