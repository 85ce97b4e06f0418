"""Airflow 3 hardening: run-leases with fencing tokens so business effects happen exactly once.

``lease`` is the engine-neutral core (no Airflow, no Temporal); ``protection`` is the Airflow
side; ``views`` and ``watcher`` are the UI pages and the missed-run watcher; ``demo`` is the
incident replay and the stack launcher the tests share.
"""

from airflow_plugins.old_paths import keep_old_paths

keep_old_paths(
    "airflow_plugins",
    {
        "airflow_plugins.config": "airflow_plugins.protection.config",
        "airflow_plugins.decorators": "airflow_plugins.protection.decorators",
        "airflow_plugins.early_acquire": "airflow_plugins.protection.early_acquire",
        "airflow_plugins.embedded_postgres": "airflow_plugins.demo.embedded_postgres",
        "airflow_plugins.fence_context": "airflow_plugins.lease.fence",
        "airflow_plugins.keys": "airflow_plugins.lease.keys",
        "airflow_plugins.lease_store_hook": "airflow_plugins.protection.lease_store_hook",
        "airflow_plugins.listener": "airflow_plugins.protection.listener",
        "airflow_plugins.operators": "airflow_plugins.protection.operators",
        "airflow_plugins.plugin": "airflow_plugins.protection.plugin",
        "airflow_plugins.policy": "airflow_plugins.protection.policy",
        "airflow_plugins.prewarm": "airflow_plugins.protection.connection_warmup",
        "airflow_plugins.protected_try": "airflow_plugins.protection.protected_try",
        "airflow_plugins.recorded_result": "airflow_plugins.protection.recorded_result",
        "airflow_plugins.routing": "airflow_plugins.protection.routing",
        "airflow_plugins.sla": "airflow_plugins.protection.sla",
        "airflow_plugins.task_key": "airflow_plugins.protection.task_identity",
        "airflow_plugins.triggers": "airflow_plugins.protection.triggers",
    },
)
