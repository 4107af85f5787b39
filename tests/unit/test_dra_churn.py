"""A driver that keeps republishing slices (docs/dra.md, "Churn"): a node's GPUs are summarised once
per change, events are coalesced into one re-apply per node, and no node is fetched again from the
API server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

import app.core.dra as dra_module
from app.cluster.cache import ClusterCache
from app.cluster.dra import DraWatcher
from app.config import Settings
from app.core.catalog import GpuCatalog
from app.core.snapshot import ClusterSnapshot
from app.metrics import Metrics
from app.sim.fleet import node_object
from tests.unit.test_dra import gpu_device, rslice


class NoGets:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API server was asked: {name}")


def watcher(settings: Settings, catalog: GpuCatalog) -> tuple[DraWatcher, ClusterCache]:
    snap = ClusterSnapshot()
    cache = ClusterCache(client.ApiClient(), snap, threading.RLock(), catalog, settings, Metrics())
    cache._apply_node(node_object("big", gpus=0))
    w = DraWatcher(client.ApiClient(), cache)
    w.core = NoGets()  # type: ignore[assignment]
    return w, cache


def test_slice_events_are_coalesced_and_need_no_node_get(
        settings: Settings, catalog: GpuCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    w, cache = watcher(settings, catalog)
    summaries = 0
    real = dra_module.node_gpus

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal summaries
        summaries += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(dra_module, "node_gpus", counting)
    for i in range(50):  # 50 slices of 8 GPUs each on one node, one event each
        with w.lock:
            changed = w._put("resourceslices", rslice(
                "big", [gpu_device(8 * i + j, "NVIDIA H100 80GB HBM3", "81559Mi") for j in range(8)],
                name=f"big-{i}"), False)
        w.mark(*changed)
    assert summaries == 0  # nothing recomputed per event
    w.flush()
    assert cache.snapshot.nodes["big"].gpu_count == 400
    # One summary for overlay, MIG slices and MIG parents together, for the whole burst.
    assert summaries == 1
    w.flush()  # nothing changed since: nothing recomputed
    assert summaries == 1
