"""A paging callback for the watcher's test: appends each missed run to a JSON-lines file.

Configured as ``[exactly_once] watcher_callback = tests.watcher.paging:page``; the file is
``$WATCHER_TEST_PAGES``. A real deployment routes the same call to its pager.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from airflow_plugins.watcher import RunReport


def page(report: RunReport) -> None:
    """Records one page: which run, when it was due, and when it was paged."""
    line = {
        "dag_id": report.run.dag_id,
        "business_date": report.run.business_date,
        "scheduled_at": report.run.scheduled_at.isoformat(),
        "deadline": report.run.deadline.isoformat(),
        "paged_at": datetime.now(UTC).isoformat(),
        "missing": list(report.missing_tasks),
    }
    with open(os.environ["WATCHER_TEST_PAGES"], "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
