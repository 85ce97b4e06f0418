-- Lease store: re-run generations. Each approved re-run of a succeeded key raises the key's
-- generation; the holders of that re-run write their sink ledger items in the new generation
-- (sql/sink: ledger generations), so the re-run re-does the effects once instead of finding
-- every item done. The approval's audit row names the generation it opened.
-- Idempotent: the column is added once, the function replaced.

ALTER TABLE runlease.lease ADD COLUMN IF NOT EXISTS generation integer NOT NULL DEFAULT 0
    CHECK (generation >= 0);

-- As in version 1, and: a succeeded key's approval opens the next generation (in its audit
-- row's output). A key with no record (older than the horizon) keeps generation 0: the store
-- does not know whether it was done, so the sink's ledger of it is honoured.
CREATE OR REPLACE FUNCTION runlease.approve_rerun(
    p_key text, p_business_date date, p_actor text, p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_row        runlease.lease%ROWTYPE;
    v_generation integer := 0;
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
        UPDATE runlease.lease l
        SET rerun_approved = true,
            generation = l.generation + (NOT l.rerun_approved)::integer
        WHERE l.key = p_key
        RETURNING l.generation INTO v_generation;
    ELSE
        RETURN 'not_needed';
    END IF;
    PERFORM runlease.record(p_key, 'approve_rerun', v_row.token, v_row.holder, v_row.attempt,
        coalesce(p_business_date, v_row.business_date), NULL,
        jsonb_build_object('generation', v_generation), NULL, 'approved', p_actor, p_reason);
    RETURN 'approved';
END;
$$;
