SELECT EXISTS (
    SELECT 1 FROM billing.charges WHERE business_date = %(business_date)s AND customer = %(customer)s
)
