"""Airflow 3 hardening: run-leases with fencing tokens so business effects happen exactly once.

``airflow_plugins.lease`` is the lease store (no Airflow import); the Airflow parts (operator,
policy, listener, plugin) live beside it.
"""
