"""Named SQL blocks of this package (``sql/queries.sql``), loaded once."""

from __future__ import annotations

from airflow_plugins.lease.queries import QueryBook

query = QueryBook("airflow_plugins.views", "sql/queries.sql")
