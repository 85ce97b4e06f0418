"""The Airflow side: the operator, decorator, policy, listener, triggers and plugin.

Each protected try runs through ``protected_try``: it takes the task's lease from the engine-
neutral core (``airflow_plugins.lease``) and gives the body a ``Fence``.
"""
