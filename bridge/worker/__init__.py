"""What runs in the bridge worker: the workflows, the activities, and the worker process.

Nothing here is imported by an Airflow task process. Start it with ``python -m bridge.worker``.
"""
