-- The peak day and the year the audit benchmark fills (bench/audit_queries.py).
-- Named blocks; every parameter bound; '%%' is the modulo operator under psycopg.

-- name: fill_audit
-- 10M audit rows: 2.5M executions of 50,000 DAGs x 5 tasks x 10 hours, four rows each
-- (granted, completed, a blocked duplicate, a completion).
INSERT INTO runlease.audit (at, key, event, token, holder, attempt, business_date, input,
                            output, duration_ms, outcome, actor, reason)
SELECT now() - make_interval(secs => (i %% 86000)),
       'dag_' || (j %% 50000) || '/task_' || ((j / 50000) %% 5) || '/' || %(day)s || 'T'
           || lpad(((j / 250000) %% 10)::text, 2, '0'),
       CASE WHEN i %% 4 IN (0, 2) THEN 'acquire' ELSE 'complete' END,
       j + 1000,
       jsonb_build_object('engine', 'airflow', 'dag_id', 'dag_' || (j %% 50000), 'try_number', 1,
                          'host', 'worker-' || (j %% 64), 'pid', 1000 + j %% 30000),
       1, %(day)s::date,
       CASE WHEN i %% 4 = 0 THEN jsonb_build_object('tenant', j %% 977) END,
       CASE WHEN i %% 4 = 1 THEN jsonb_build_object('rows', j %% 1000) END,
       CASE WHEN i %% 4 = 1 THEN 1000 + j %% 60000 END,
       CASE i %% 4 WHEN 0 THEN 'granted' WHEN 1 THEN 'succeeded' WHEN 2 THEN 'held'
                  ELSE 'succeeded' END,
       NULL, NULL
FROM generate_series(0, %(rows)s - 1) AS i, LATERAL (SELECT i / 4 AS j) AS job;

-- name: fill_leases
-- The lease row of each of those executions.
INSERT INTO runlease.lease (key, state, token, holder, attempt, business_date, acquired_at,
                            expires_at, finished_at, result)
SELECT 'dag_' || (j %% 50000) || '/task_' || ((j / 50000) %% 5) || '/' || %(day)s || 'T'
           || lpad(((j / 250000) %% 10)::text, 2, '0'),
       'succeeded', j + 1000, '{"engine": "airflow"}', 1, %(day)s::date,
       now() - interval '1 hour', now(), now(), '{"ok": true}'
FROM generate_series(0, %(jobs)s - 1) AS j
ON CONFLICT DO NOTHING;

-- name: fill_year
-- A year of an hourly DAG with two protected tasks; 5 runs missing (hours 100-102, 5000,
-- 8000 of the year).
INSERT INTO runlease.lease (key, state, token, holder, attempt, business_date, acquired_at,
                            expires_at, finished_at, result)
SELECT 'rollup_hourly/' || t || '/' || to_char(h, 'YYYY-MM-DD"T"HH24'),
       'succeeded', nextval('runlease.fencing_token'), '{"engine": "airflow"}', 1, h::date,
       h + interval '20 seconds', h + interval '80 seconds', h + interval '70 seconds', '{}'
FROM generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '1 hour',
                     interval '1 hour') AS h,
     unnest(ARRAY['aggregate', 'publish']) AS t
WHERE extract(epoch FROM h - %(start)s::timestamptz)::bigint / 3600
      NOT IN (100, 101, 102, 5000, 8000);
