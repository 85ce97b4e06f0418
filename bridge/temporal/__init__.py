"""Talking to Temporal: the client, the payload codec, the handover, Temporal Schedules.

Loaded by the triggerer, the handover's child process, the worker and the CLI, never by an
Airflow task process (temporalio can abort an interpreter at exit).
"""
