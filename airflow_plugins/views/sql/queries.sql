-- Named queries of the views, loaded once by airflow_plugins.views.queries. Read-only: every
-- change goes through the lease store's audited functions. Every parameter is bound. Every
-- query is bounded by a LIMIT; those over several DAGs take %(dags)s, the DAG ids the user may
-- read (NULL: all); the one-DAG queries run after the page checked the user may read it.

-- name: live_leases
-- Running leases, soonest expiry first (the lease_running index finds them; they are few).
SELECT key, state, token, holder, attempt, business_date, acquired_at, expires_at, renewed_at,
       takeovers, (expires_at < now()) AS expired,
       extract(epoch FROM expires_at - now()) AS expires_in_s
FROM runlease.lease
WHERE state = 'running'
  AND (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
  AND (%(dags)s::text[] IS NULL OR split_part(key, '/', 1) = ANY(%(dags)s::text[]))
ORDER BY expires_at
LIMIT %(limit)s;

-- name: lease_counts
SELECT state, count(*) AS n, count(*) FILTER (WHERE takeovers > 0) AS taken_over,
       count(*) FILTER (WHERE state = 'running' AND expires_at < now()) AS expired
FROM runlease.lease
WHERE (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
  AND (%(dags)s::text[] IS NULL OR split_part(key, '/', 1) = ANY(%(dags)s::text[]))
GROUP BY state;

-- name: acquire_outcomes_by_hour
-- Acquire answers per hour over the last hours: granted, taken over, blocked (held: a
-- duplicate while another holder runs; succeeded: a duplicate after the work was done),
-- refused. The audit's primary key starts with `at`, so this reads only those hours.
SELECT date_trunc('hour', at) AS hour, outcome, count(*) AS n
FROM runlease.audit
WHERE at >= now() - make_interval(hours => %(hours)s)
  AND event = 'acquire'
  AND (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
  AND (%(dags)s::text[] IS NULL OR split_part(key, '/', 1) = ANY(%(dags)s::text[]))
GROUP BY 1, 2
ORDER BY 1;

-- name: recent_outcomes
-- Takeovers and blocked duplicates, newest first.
SELECT id, at, key, event, token, holder, attempt, outcome, reason, input
FROM runlease.audit
WHERE at >= now() - make_interval(hours => %(hours)s)
  AND event = 'acquire'
  AND outcome = ANY(%(outcomes)s::text[])
  AND (%(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text))
  AND (%(dags)s::text[] IS NULL OR split_part(key, '/', 1) = ANY(%(dags)s::text[]))
ORDER BY at DESC
LIMIT %(limit)s;

-- name: audit_of_run
-- Every audit row of one DAG's keys for a business date (all periods that start with it:
-- the day's hours for an hourly DAG; shadow keys included), but not the second occurrence of
-- the same period (the fold range: '2024-10-27T02.fold' is another hour than '2024-10-27T02').
-- Uses the audit_dag_period index.
SELECT id, at, key, event, token, holder, attempt, business_date, input, output,
       duration_ms, outcome, actor, reason
FROM runlease.audit
WHERE split_part(key, '/', 1) = %(dag_id)s
  AND split_part(key, '/', 3) COLLATE "C" >= %(period_from)s
  AND split_part(key, '/', 3) COLLATE "C" < %(period_to)s
  AND NOT (split_part(key, '/', 3) COLLATE "C" >= %(fold_from)s
           AND split_part(key, '/', 3) COLLATE "C" < %(fold_to)s)
ORDER BY at, id
LIMIT %(limit)s;

-- name: leases_of_run
-- The current lease rows of one DAG's keys for a business date, as audit_of_run chooses them
-- (the lease_dag_period index).
SELECT key, state, token, holder, attempt, acquired_at, finished_at, result, error, takeovers
FROM runlease.lease
WHERE split_part(key, '/', 1) = %(dag_id)s
  AND split_part(key, '/', 3) COLLATE "C" >= %(period_from)s
  AND split_part(key, '/', 3) COLLATE "C" < %(period_to)s
  AND NOT (split_part(key, '/', 3) COLLATE "C" >= %(fold_from)s
           AND split_part(key, '/', 3) COLLATE "C" < %(fold_to)s)
ORDER BY key
LIMIT %(limit)s;

