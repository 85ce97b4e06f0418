-- The task state of a lease key's work and its job submissions (airflow_plugins.lease.task_state).
-- Every write is one statement that locks the key's lease row FOR SHARE and writes only while
-- the row is running under the writer's token: a write racing a takeover waits for it and is
-- then refused; a superseded holder's write changes nothing and gets held = 0 back. Each
-- write's audit row is written by the same statement.

-- name: state_get
SELECT value FROM runlease.task_state
WHERE key = %(key)s AND generation = %(generation)s AND name = %(name)s
  AND (expires_at IS NULL OR expires_at > clock_timestamp());

-- name: state_all
SELECT name, value FROM runlease.task_state
WHERE key = %(key)s AND generation = %(generation)s
  AND (expires_at IS NULL OR expires_at > clock_timestamp())
ORDER BY name;

-- name: state_set
WITH holder AS (
    SELECT l.key, l.holder, l.attempt, l.business_date
    FROM runlease.lease l
    WHERE l.key = %(key)s::text AND l.token = %(token)s::bigint AND l.state = 'running'
    FOR SHARE
), written AS (
    INSERT INTO runlease.task_state AS s (key, generation, name, value, token, expires_at)
    SELECT h.key, %(generation)s::integer, %(name)s::text, %(value)s::jsonb, %(token)s::bigint,
           clock_timestamp() + make_interval(secs => %(retention_s)s::float8)
    FROM holder h
    ON CONFLICT (key, generation, name) DO UPDATE
    SET value = excluded.value, token = excluded.token, updated_at = clock_timestamp(),
        expires_at = excluded.expires_at
    WHERE s.token <= excluded.token
    RETURNING s.name
), audited AS (
    INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date, output,
                                outcome)
    SELECT h.key, 'state_set', %(token)s::bigint, h.holder, h.attempt, h.business_date,
           jsonb_build_object('name', %(name)s::text, 'generation', %(generation)s::integer,
                              'value', %(audit)s::jsonb),
           'written'
    FROM holder h WHERE EXISTS (SELECT FROM written)
)
SELECT (SELECT count(*) FROM holder) AS held, (SELECT count(*) FROM written) AS written;

-- name: state_delete
-- Deletes one name, or every name of the key's generation when %(name)s is NULL (clear).
WITH holder AS (
    SELECT l.key, l.holder, l.attempt, l.business_date
    FROM runlease.lease l
    WHERE l.key = %(key)s::text AND l.token = %(token)s::bigint AND l.state = 'running'
    FOR SHARE
), gone AS (
    DELETE FROM runlease.task_state s USING holder h
    WHERE s.key = h.key AND s.generation = %(generation)s::integer
      AND (%(name)s::text IS NULL OR s.name = %(name)s::text)
    RETURNING s.name
), audited AS (
    INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date, output,
                                outcome)
    SELECT h.key, CASE WHEN %(name)s::text IS NULL THEN 'state_clear' ELSE 'state_delete' END,
           %(token)s::bigint, h.holder, h.attempt, h.business_date,
           jsonb_build_object('names', (SELECT jsonb_agg(g.name ORDER BY g.name) FROM gone g),
                              'generation', %(generation)s::integer),
           'deleted'
    FROM holder h WHERE EXISTS (SELECT FROM gone)
)
SELECT (SELECT count(*) FROM holder) AS held, (SELECT count(*) FROM gone) AS deleted;

-- name: job_intend
-- Claims the submission of a job under a name before it is submitted. A new name starts round
-- 1; an intent an earlier holder left without a job id is taken over (claims + 1: that holder
-- may have submitted); a recorded job is followed by a new round (the caller saw it end and
-- submits afresh). Returns nothing when the caller does not hold the lease.
WITH holder AS (
    SELECT l.key, l.holder, l.attempt, l.business_date
    FROM runlease.lease l
    WHERE l.key = %(key)s::text AND l.token = %(token)s::bigint AND l.state = 'running'
    FOR SHARE
), claimed AS (
    INSERT INTO runlease.job_submission AS j (key, generation, name, state, token)
    SELECT h.key, %(generation)s::integer, %(name)s::text, 'intended', %(token)s::bigint
    FROM holder h
    ON CONFLICT (key, generation, name) DO UPDATE
    SET token = excluded.token,
        round = j.round + (j.state = 'submitted')::integer,
        claims = CASE WHEN j.state = 'submitted' THEN 1 ELSE j.claims + 1 END,
        intended_at = CASE WHEN j.state = 'submitted' THEN clock_timestamp()
                           ELSE j.intended_at END,
        external_id = CASE WHEN j.state = 'submitted' THEN NULL ELSE j.external_id END,
        submitted_at = NULL,
        state = 'intended'
    WHERE j.token <= excluded.token
    RETURNING j.round, j.claims
), audited AS (
    INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date, output,
                                outcome)
    SELECT h.key, 'job_intent', %(token)s::bigint, h.holder, h.attempt, h.business_date,
           jsonb_build_object('name', %(name)s::text, 'generation', %(generation)s::integer,
                              'round', c.round, 'claims', c.claims),
           CASE WHEN c.claims > 1 THEN 'in_doubt' ELSE 'intended' END
    FROM holder h, claimed c
)
SELECT round, claims FROM claimed;

-- name: job_record
-- Records the submitted job's id for the round the caller claimed, and stores it as the
-- name's task state value, in one statement.
WITH holder AS (
    SELECT l.key, l.holder, l.attempt, l.business_date
    FROM runlease.lease l
    WHERE l.key = %(key)s::text AND l.token = %(token)s::bigint AND l.state = 'running'
    FOR SHARE
), recorded AS (
    UPDATE runlease.job_submission j
    SET state = 'submitted', external_id = %(external_id)s::jsonb, token = %(token)s::bigint,
        submitted_at = clock_timestamp()
    FROM holder h
    WHERE j.key = h.key AND j.generation = %(generation)s::integer AND j.name = %(name)s::text
      AND j.round = %(round)s::integer AND j.state = 'intended' AND j.token <= %(token)s::bigint
    RETURNING j.key
), stored AS (
    INSERT INTO runlease.task_state AS s (key, generation, name, value, token)
    SELECT r.key, %(generation)s::integer, %(name)s::text, %(external_id)s::jsonb,
           %(token)s::bigint
    FROM recorded r
    ON CONFLICT (key, generation, name) DO UPDATE
    SET value = excluded.value, token = excluded.token, updated_at = clock_timestamp(),
        expires_at = NULL
    WHERE s.token <= excluded.token
), audited AS (
    INSERT INTO runlease.audit (key, event, token, holder, attempt, business_date, output,
                                outcome)
    SELECT h.key, 'job_submitted', %(token)s::bigint, h.holder, h.attempt, h.business_date,
           jsonb_build_object('name', %(name)s::text, 'generation', %(generation)s::integer,
                              'round', %(round)s::integer, 'external_id', %(audit)s::jsonb,
                              'found', %(found)s::boolean),
           CASE WHEN %(found)s::boolean THEN 'found' ELSE 'submitted' END
    FROM holder h WHERE EXISTS (SELECT FROM recorded)
)
SELECT (SELECT count(*) FROM holder) AS held, (SELECT count(*) FROM recorded) AS recorded;

-- name: job_get
SELECT name, round, state, external_id, claims, token
FROM runlease.job_submission
WHERE key = %(key)s AND generation = %(generation)s AND name = %(name)s;
