INSERT INTO billing.charges
    (business_date, customer, amount_cents, token, writer, outcome, processor_ref)
VALUES (%(business_date)s, %(customer)s, %(amount_cents)s, %(token)s, %(writer)s, %(outcome)s,
        %(processor_ref)s)
