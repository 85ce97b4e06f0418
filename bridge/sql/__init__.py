"""The bridge's SQL: numbered migrations and named query blocks, loaded once.

A block in ``queries.sql`` starts with a line ``-- name: <name>``; its text runs until the next.
"""

from __future__ import annotations

from airflow_plugins.lease.queries import QueryBook

query = QueryBook("bridge.sql", "queries.sql")
