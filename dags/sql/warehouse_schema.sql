-- Tables of the analytics, ML and webhook examples (in the warehouse database).
CREATE SCHEMA IF NOT EXISTS analytics;
CREATE TABLE IF NOT EXISTS analytics.hourly_charges (
    hour          text        PRIMARY KEY,
    charges       bigint      NOT NULL,
    amount_cents  bigint      NOT NULL,
    token         bigint      NOT NULL,
    rolled_up_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE SCHEMA IF NOT EXISTS ml;
CREATE TABLE IF NOT EXISTS ml.features (
    business_date text        NOT NULL,
    customer      text        NOT NULL,
    amount_cents  bigint      NOT NULL,
    PRIMARY KEY (business_date, customer)
);
CREATE TABLE IF NOT EXISTS ml.models (
    id            bigserial   PRIMARY KEY,
    business_date text        NOT NULL,
    mean_cents    double precision NOT NULL,
    rows_seen     bigint      NOT NULL,
    trained_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS ml.deployments (
    model_id      bigint      PRIMARY KEY REFERENCES ml.models (id),
    deployed_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE SCHEMA IF NOT EXISTS webhooks;
CREATE TABLE IF NOT EXISTS webhooks.outbox (
    id              bigserial   PRIMARY KEY,
    tenant          text        NOT NULL,
    business_date   text        NOT NULL,
    idempotency_key text        NOT NULL,
    headers         jsonb       NOT NULL,
    payload         jsonb       NOT NULL,
    queued_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
