"""Airflow 3 hardening: run-leases with fencing tokens so business effects happen exactly once.

``lease`` is the engine-neutral core (no Airflow, no Temporal); ``protection`` is the Airflow
side; ``views`` and ``watcher`` are the UI pages and the missed-run watcher; ``demo`` is the
incident replay and the stack launcher the tests share.
"""

from airflow_plugins.old_paths import keep_old_paths

keep_old_paths("airflow_plugins")
