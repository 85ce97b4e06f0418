-- Sink fence, version 1: lives in the sink's own database, next to the rows it guards.
-- A fenced transaction advances `fence` and claims `ledger` rows in the same commit as the
-- business writes, so a superseded holder's commit fails and a taken-over run skips done items.

CREATE SCHEMA IF NOT EXISTS runfence;

-- The highest fencing token that has written under each key.
CREATE TABLE IF NOT EXISTS runfence.fence (
    key         text        PRIMARY KEY CHECK (char_length(key) BETWEEN 1 AND 512),
    token       bigint      NOT NULL,
    advanced_at timestamptz NOT NULL DEFAULT now()
);

-- Items done under each key; unique, so no item is done twice whoever holds the key.
CREATE TABLE IF NOT EXISTS runfence.ledger (
    key         text        NOT NULL,
    item        text        NOT NULL CHECK (char_length(item) BETWEEN 1 AND 512),
    token       bigint      NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, item)
);
