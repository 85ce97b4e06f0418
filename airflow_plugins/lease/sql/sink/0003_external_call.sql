-- Sink fence: the ledger of external calls (a payment processor, a webhook). One row per
-- (key, item): claimed as intended in one fenced transaction before the call leaves, answered
-- in another after the processor replied. The idempotency key is the item's, the same for every
-- holder of the key, so a holder taking over an intended item re-sends the same request and the
-- processor replays its first answer instead of acting twice. An approved re-run calls in the
-- key's next ledger generation, with idempotency keys of its own, so it calls once more.

CREATE SCHEMA IF NOT EXISTS runfence;

CREATE TABLE IF NOT EXISTS runfence.external_call (
    key             text        NOT NULL CHECK (char_length(key) BETWEEN 1 AND 512),
    generation      integer     NOT NULL DEFAULT 0 CHECK (generation >= 0),
    item            text        NOT NULL CHECK (char_length(item) BETWEEN 1 AND 512),
    idempotency_key text        NOT NULL,
    request         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'intended'
                                CHECK (state IN ('intended', 'accepted', 'declined')),
    reference       text,
    answer          jsonb,
    token           bigint      NOT NULL,
    sends           integer     NOT NULL DEFAULT 0,
    intended_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    answered_at     timestamptz,
    PRIMARY KEY (key, generation, item)
);

CREATE INDEX IF NOT EXISTS external_call_open ON runfence.external_call (key)
    WHERE state = 'intended';
