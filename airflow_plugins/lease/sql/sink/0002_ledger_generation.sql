-- Sink fence: ledger generations. An approved re-run of a succeeded key (the lease store's
-- approve_rerun, audited) gets the key's next generation, and its items are claimed afresh in
-- it: the re-run re-does each effect once, while every retry or takeover inside one
-- generation still skips what that generation did. Rows written before this migration are
-- generation 0, the generation of every key that was never re-run.
-- Idempotent; the primary key is rebuilt once (the ledger is locked while it is).

ALTER TABLE runfence.ledger ADD COLUMN IF NOT EXISTS generation integer NOT NULL DEFAULT 0
    CHECK (generation >= 0);

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_constraint c
        WHERE c.conrelid = 'runfence.ledger'::regclass AND c.contype = 'p'
          AND array_length(c.conkey, 1) = 3
    ) THEN
        ALTER TABLE runfence.ledger DROP CONSTRAINT IF EXISTS ledger_pkey;
        ALTER TABLE runfence.ledger
            ADD CONSTRAINT ledger_pkey PRIMARY KEY (key, generation, item);
    END IF;
END;
$$;
