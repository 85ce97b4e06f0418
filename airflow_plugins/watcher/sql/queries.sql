-- Named queries of the missed-run watcher, loaded once by airflow_plugins.watcher.reads.
-- Every parameter is bound (%(name)s); nothing is formatted in.

-- name: dag_leases
-- Business periods are compared as the text the key holds (ISO forms sort in time order);
-- the expression matches the lease_dag_period index.
-- The lease rows of one DAG whose business dates fall in a window, with the first grant of
-- each key from the audit trail (a takeover or an approved re-run moves acquired_at; the
-- schedule lag is measured to the first grant). Shadow keys are a dual-run's, not the run's.
SELECT l.key, l.state, l.token, l.business_date, l.acquired_at, l.finished_at, l.takeovers,
       coalesce(
           (SELECT min(a.at) FROM runlease.audit a
            -- the dag and period of the key, spelled out for the audit_dag_period index
            WHERE split_part(a.key, '/', 1) = %(dag_id)s
              AND split_part(a.key, '/', 3) COLLATE "C" = split_part(l.key, '/', 3) COLLATE "C"
              AND a.key = l.key AND a.event = 'acquire'
              AND a.outcome IN ('granted', 'taken_over')),
           l.acquired_at) AS first_granted_at
FROM runlease.lease l
WHERE split_part(l.key, '/', 1) = %(dag_id)s
  AND split_part(l.key, '/', 3) COLLATE "C" BETWEEN %(first_period)s AND %(last_period)s
  AND right(l.key, 7) <> '#shadow';

-- name: dag_leases_plain
-- The same rows without the audit lookup (gap detection over long periods: no lags needed).
SELECT l.key, l.state, l.token, l.business_date, l.acquired_at, l.finished_at, l.takeovers,
       l.acquired_at AS first_granted_at
FROM runlease.lease l
WHERE split_part(l.key, '/', 1) = %(dag_id)s
  AND split_part(l.key, '/', 3) COLLATE "C" BETWEEN %(first_period)s AND %(last_period)s
  AND right(l.key, 7) <> '#shadow';

-- name: reported_missed
-- Missed runs the watcher already reported (so a restarted watcher pages once per run).
SELECT DISTINCT a.key
FROM runlease.audit a
WHERE split_part(a.key, '/', 1) = %(dag_id)s
  AND split_part(a.key, '/', 3) COLLATE "C" BETWEEN %(first_period)s AND %(last_period)s
  AND a.event = 'missed_run';
