INSERT INTO webhooks.outbox (tenant, business_date, idempotency_key, headers, payload)
VALUES (%(tenant)s, %(business_date)s, %(idempotency_key)s, %(headers)s, %(payload)s)
