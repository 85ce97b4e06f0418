INSERT INTO billing.charges (business_date, customer, amount_cents, token, writer)
VALUES (%(business_date)s, %(customer)s, %(amount_cents)s, %(token)s, %(writer)s)
