-- Least-privilege grants of the lease store, applied by airflow_plugins.lease.roles (`python -m
-- airflow_plugins.lease.roles`) as the store's owner. {task}, {operator} and {reader} are role
-- names, quoted as identifiers by the caller. The owner keeps DDL, partitions and retention.

-- task: what a try, the listener and the re-run path run (acquire, renew, finish, record,
-- fail_on_behalf, history). It writes lease rows through the lease statements; it can only
-- append to the audit, never change or delete a row of it.
GRANT USAGE ON SCHEMA runlease TO {task};
GRANT SELECT, INSERT, UPDATE ON runlease.lease TO {task};
GRANT SELECT, INSERT ON runlease.audit TO {task};
GRANT SELECT ON runlease.retention TO {task};
GRANT USAGE ON SEQUENCE runlease.fencing_token TO {task};
GRANT USAGE ON SEQUENCE runlease.audit_id_seq TO {task};
REVOKE DELETE, TRUNCATE ON runlease.lease, runlease.audit FROM {task};
-- the durable state of a try's work and its job submissions (each write guarded by the token)
GRANT SELECT, INSERT, UPDATE, DELETE ON runlease.task_state, runlease.job_submission TO {task};

-- operator: what the task does, plus the administrative changes (force-release, approve a
-- re-run), each audited with its actor and reason.
GRANT {task} TO {operator};
GRANT EXECUTE ON FUNCTION runlease.force_release(text, text, text) TO {operator};
GRANT EXECUTE ON FUNCTION runlease.approve_rerun(text, date, text, text) TO {operator};

-- reader: the pages and the watcher's reads.
GRANT USAGE ON SCHEMA runlease TO {reader};
GRANT SELECT ON runlease.lease, runlease.audit, runlease.retention TO {reader};
GRANT SELECT ON runlease.task_state, runlease.job_submission TO {reader};
