-- The billing database of the examples: one row per charge sent to the payment processor.
-- Deliberately unique on nothing but its id, as a real charges table is: a customer charged
-- twice shows up as two rows.
CREATE SCHEMA IF NOT EXISTS billing;

CREATE TABLE IF NOT EXISTS billing.charges (
    id            bigserial   PRIMARY KEY,
    business_date text        NOT NULL,
    customer      text        NOT NULL,
    amount_cents  bigint      NOT NULL,
    token         bigint      NOT NULL DEFAULT 0,
    writer        text        NOT NULL,
    charged_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX IF NOT EXISTS charges_by_date ON billing.charges (business_date, customer);

-- What the payment processor answered for the charge: its charge id, or a decline.
ALTER TABLE billing.charges ADD COLUMN IF NOT EXISTS outcome text NOT NULL DEFAULT 'charged';
ALTER TABLE billing.charges ADD COLUMN IF NOT EXISTS processor_ref text;
