"""``context["asset_state_store"]`` of a task the worker runs: Airflow 3.3's API, the bridge's rows.

Airflow keeps an asset's state (a watermark, a last-run summary) on the asset: not scoped to a
run, so run 2 reads what run 1 wrote, and another DAG reading the asset reads it too. The worker
gives a task the same accessors (``AssetStateStoreAccessors``' mapping by asset, and the
single-asset shorthand; ``get`` / ``set`` / ``delete`` / ``clear`` and their async ``a...``
forms) over ``bridge.asset_state`` in the bridge's Postgres store, keyed by the asset's name and
by the engine's role (``RunMode``): a shadow run reads and writes the shadow's rows, never the
primary's, and Airflow's own rows stay in Airflow's metadata DB. The context holds it only when
the task has a concrete asset among its inlets or outlets, as in Airflow.

Limits: an asset is keyed by its name (``AssetUriRef`` by its URI, which is the name of an asset
declared by URI alone); ``AssetAlias`` inlets, which Airflow resolves through its metadata DB,
give no accessor.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from psycopg.types.json import Jsonb

from airflow_plugins.lease import LeaseStore
from airflow_plugins.lease.queries import QueryBook
from bridge.spec import RunMode

query = QueryBook("bridge.sql", "asset_state.sql")
CONTEXT_KEY = "asset_state_store"


class BridgeAssetStateStore:
    """The state of one asset, as one run of one task reads and writes it.

    Args:
        store: the bridge's store (its Postgres).
        mode: whose rows: the primary's or the shadow's.
        asset: the asset's name.
        writer: the (dag_id, run_id, task_id) recorded with a write.
    """

    def __init__(
        self, store: LeaseStore, *, mode: RunMode, asset: str, writer: tuple[str, str, str]
    ) -> None:
        self._store = store
        self._mode = mode
        self._asset = asset
        self._writer = writer

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BridgeAssetStateStore) and (other._asset, other._mode) == (
            self._asset,
            self._mode,
        )

    def __hash__(self) -> int:
        return hash((self._asset, self._mode))

    def __repr__(self) -> str:
        return f"<BridgeAssetStateStore name={self._asset!r} mode={self._mode.value}>"

    def _params(self, **more: Any) -> dict[str, Any]:
        return {"mode": self._mode.value, "asset": self._asset, **more}

    def get(self, key: str, default: Any = None) -> Any:
        """The value stored under ``key`` for the asset (by any run of any DAG), or ``default``."""
        with self._store.connection() as conn:
            row = conn.execute(query("asset_state_get"), self._params(key=key)).fetchone()
        return default if row is None else row["value"]

    def set(self, key: str, value: Any) -> None:
        """Writes or overwrites ``key``.

        Raises:
            ValueError: ``value`` is None (as in Airflow).
            TypeError: ``value`` is not JSON.
        """
        if value is None:
            raise ValueError("Cannot set value as None")
        json.dumps(value)  # a value Airflow could not store either: fail before writing
        dag_id, run_id, task_id = self._writer
        params = self._params(
            key=key, value=Jsonb(value), dag_id=dag_id, run_id=run_id, task_id=task_id
        )
        with self._store.connection() as conn:
            conn.execute(query("asset_state_set"), params)

    def delete(self, key: str) -> None:
        """Deletes ``key``; no-op when it is not there."""
        with self._store.connection() as conn:
            conn.execute(query("asset_state_delete"), self._params(key=key))

    def clear(self) -> None:
        """Deletes every key of the asset's state."""
        with self._store.connection() as conn:
            conn.execute(query("asset_state_clear"), self._params())

    async def aget(self, key: str, default: Any = None) -> Any:
        """``get`` off the event loop's thread."""
        return await asyncio.to_thread(self.get, key, default)

    async def aset(self, key: str, value: Any) -> None:
        """``set`` off the event loop's thread."""
        await asyncio.to_thread(self.set, key, value)

    async def adelete(self, key: str) -> None:
        """``delete`` off the event loop's thread."""
        await asyncio.to_thread(self.delete, key)

    async def aclear(self) -> None:
        """``clear`` off the event loop's thread."""
        await asyncio.to_thread(self.clear)


class BridgeAssetStateStores:
    """The accessors of a task's concrete inlets and outlets, as ``AssetStateStoreAccessors``:
    subscript by asset, or call the methods directly when the task has exactly one."""

    def __init__(self, by_name: dict[str, BridgeAssetStateStore]) -> None:
        self._by_name = by_name

    def __getitem__(self, asset: Any) -> BridgeAssetStateStore:
        from airflow.sdk.definitions.asset import Asset, AssetNameRef, AssetUriRef

        if isinstance(asset, Asset | AssetNameRef):
            name = asset.name
        elif isinstance(asset, AssetUriRef):
            name = asset.uri
        else:
            raise TypeError(
                f"Expected Asset, AssetNameRef, or AssetUriRef; got {type(asset).__name__}"
            )
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{asset!r} is not in this task's inlets or outlets") from None

    def _single(self) -> BridgeAssetStateStore:
        if len(self._by_name) != 1:
            raise ValueError(
                f"Task has {len(self._by_name)} concrete inlets and outlets — use "
                "context['asset_state_store'][MY_ASSET] to specify which"
            )
        return next(iter(self._by_name.values()))

    def get(self, key: str, default: Any = None) -> Any:
        """``get`` of the task's one asset."""
        return self._single().get(key, default)

    def set(self, key: str, value: Any) -> None:
        """``set`` of the task's one asset."""
        self._single().set(key, value)

    def delete(self, key: str) -> None:
        """``delete`` of the task's one asset."""
        self._single().delete(key)

    def clear(self) -> None:
        """``clear`` of the task's one asset."""
        self._single().clear()

    async def aget(self, key: str, default: Any = None) -> Any:
        """``aget`` of the task's one asset."""
        return await self._single().aget(key, default)

    async def aset(self, key: str, value: Any) -> None:
        """``aset`` of the task's one asset."""
        await self._single().aset(key, value)

    async def adelete(self, key: str) -> None:
        """``adelete`` of the task's one asset."""
        await self._single().adelete(key)

    async def aclear(self) -> None:
        """``aclear`` of the task's one asset."""
        await self._single().aclear()


def asset_names(assets: Iterable[Any]) -> list[str]:
    """The names the worker keys the concrete assets among ``assets`` by (aliases left out)."""
    from airflow.sdk.definitions.asset import Asset, AssetNameRef, AssetUriRef

    names: list[str] = []
    for asset in assets:
        if isinstance(asset, Asset | AssetNameRef):
            names.append(asset.name)
        elif isinstance(asset, AssetUriRef):
            names.append(asset.uri)
    return list(dict.fromkeys(names))


def asset_state_stores(
    store: LeaseStore, task: Any, *, mode: RunMode, run_id: str
) -> BridgeAssetStateStores | None:
    """The task's ``asset_state_store``; None when it has no concrete inlet or outlet (Airflow's
    context then has no such key)."""
    names = asset_names([*(task.inlets or ()), *(task.outlets or ())])
    if not names:
        return None
    writer = (str(task.dag_id), run_id, str(task.task_id))
    return BridgeAssetStateStores(
        {name: BridgeAssetStateStore(store, mode=mode, asset=name, writer=writer) for name in names}
    )
