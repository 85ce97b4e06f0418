"""Per-tenant scheduled webhooks: one mapped task instance per tenant, every hour.

The mapped task is keyed by tenant, not by position: ``map_index_template`` renders the tenant
id, so the lease key is ``tenant_webhooks/send/<YYYY-MM-DDTHH>/<tenant>``, and adding or removing
a tenant never shifts another tenant's key. Each delivery goes to the outbox
(``webhooks.outbox``) in a fenced transaction, with the idempotency key and fencing-token
headers the relay sends to the tenant's endpoint.
"""

from __future__ import annotations

import json
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task
from warehouse import WAREHOUSE_CONN_ID, dsn, prepare, sql

from airflow_plugins.lease.fence import Fence
from airflow_plugins.protection.decorators import exactly_once_task

with DAG(
    dag_id="tenant_webhooks",
    schedule="0 * * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["webhooks", "example"],
    params={"tenants": Param(["acme", "globex", "initech"], type="array")},
    doc_md=__doc__,
):

    @task
    def tenants(**context: Any) -> list[str]:
        """The tenants with a webhook this hour (creates the outbox if missing)."""
        prepare(dsn())
        return [str(t) for t in context["params"]["tenants"]]

    @exactly_once_task(
        sink_conn_id=WAREHOUSE_CONN_ID,
        period="hour",
        map_index_template="{{ task.op_kwargs['tenant'] }}",
        retry_delay=pendulum.duration(seconds=10),
    )
    def send(fence: Fence, tenant: str) -> dict[str, Any]:
        """Queues this tenant's webhook for the hour, once."""
        with fence.transaction() as tx:
            if not tx.claim(tenant):
                return {"tenant": tenant, "queued": False}
            tx.conn.execute(
                sql("webhook_enqueue"),
                {
                    "tenant": tenant,
                    "business_date": fence.business_date,
                    "idempotency_key": fence.idempotency_key(tenant),
                    "headers": json.dumps(fence.headers(tenant)),
                    "payload": json.dumps({"tenant": tenant, "hour": fence.business_date}),
                },
            )
        return {"tenant": tenant, "queued": True}

    send.expand(tenant=tenants())
