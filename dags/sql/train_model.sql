INSERT INTO ml.models (business_date, mean_cents, rows_seen)
SELECT %(business_date)s, coalesce(avg(amount_cents), 0), count(*)
FROM ml.features
RETURNING id, mean_cents, rows_seen
