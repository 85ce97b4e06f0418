INSERT INTO ml.features (business_date, customer, amount_cents)
SELECT %(business_date)s, customer, sum(amount_cents)
FROM billing.charges
WHERE business_date = %(business_date)s
GROUP BY customer
ON CONFLICT (business_date, customer) DO UPDATE SET amount_cents = EXCLUDED.amount_cents
