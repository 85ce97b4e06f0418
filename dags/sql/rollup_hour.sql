INSERT INTO analytics.hourly_charges (hour, charges, amount_cents, token)
SELECT %(hour)s, count(*), coalesce(sum(amount_cents), 0), %(token)s
FROM billing.charges
WHERE charged_at >= %(start)s AND charged_at < %(end)s
ON CONFLICT (hour) DO UPDATE
SET charges = EXCLUDED.charges, amount_cents = EXCLUDED.amount_cents, token = EXCLUDED.token,
    rolled_up_at = clock_timestamp()
RETURNING charges, amount_cents
