-- The external calls (charges at a payment processor) of both sides of a comparison: what the
-- primary sent, as its sink's ledger recorded it, and what the shadow would have sent.
ALTER TABLE bridge.comparison ADD COLUMN IF NOT EXISTS primary_calls jsonb NOT NULL DEFAULT '{}';
ALTER TABLE bridge.comparison ADD COLUMN IF NOT EXISTS shadow_calls jsonb NOT NULL DEFAULT '{}';
