-- Lease store: the task state of protected work, and the external jobs it submits.
-- A value belongs to a lease key (the business identity) and its re-run generation, not to one
-- Airflow task instance: every try and every DAG run of the business date reads the same
-- values. Only the key's current holder writes them: each write is one statement that locks
-- the lease row (FOR SHARE) and writes only while the row is running under the writer's token
-- (sql/task_state.sql). An approved re-run (a new generation) starts from no state.
-- Idempotent: tables and indexes are created once.

CREATE TABLE IF NOT EXISTS runlease.task_state (
    key         text        NOT NULL REFERENCES runlease.lease (key) ON DELETE CASCADE,
    generation  integer     NOT NULL CHECK (generation >= 0),
    name        text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 512),
    value       jsonb       NOT NULL,
    -- the holder's token that wrote it
    token       bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- NULL: kept as long as the key's lease row (pruned with it)
    expires_at  timestamptz,
    PRIMARY KEY (key, generation, name)
);

-- One external job a key's work submits under a name (the operator's external_id_key): the
-- intent is recorded before the submit, the job's id after it. A holder that finds an intent
-- without an id knows an earlier holder may have submitted: it looks the job up by the
-- idempotency key instead of submitting again. "round" counts deliberate new submissions
-- (after the recorded job ended in failure); each round has an idempotency key of its own.
CREATE TABLE IF NOT EXISTS runlease.job_submission (
    key           text        NOT NULL REFERENCES runlease.lease (key) ON DELETE CASCADE,
    generation    integer     NOT NULL CHECK (generation >= 0),
    name          text        NOT NULL CHECK (char_length(name) BETWEEN 1 AND 512),
    round         integer     NOT NULL DEFAULT 1 CHECK (round >= 1),
    state         text        NOT NULL CHECK (state IN ('intended', 'submitted')),
    external_id   jsonb,
    token         bigint      NOT NULL,
    -- holders that claimed this round's intent: more than 1 means an earlier one may have
    -- submitted the job
    claims        integer     NOT NULL DEFAULT 1 CHECK (claims >= 1),
    intended_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    submitted_at  timestamptz,
    PRIMARY KEY (key, generation, name)
);
