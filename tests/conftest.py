"""Shared fixtures: a settings object, the packaged catalog, and a mixed heterogeneous cluster."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object
from app.config.settings import Settings
from app.extender.service import ExtenderService

ZONE = "topology.kubernetes.io/zone"


@pytest.fixture(scope="session")
def catalog() -> GpuCatalog:
    return GpuCatalog.load()


@pytest.fixture
def settings() -> Settings:
    return Settings(cluster_source="none", metrics_port=0)


def mixed_nodes() -> list[dict[str, Any]]:
    """H200/H100/A100 with NVLink + IB, L40S, L4, T4, CPU and storage nodes: one of each shape."""
    fab = {"fabric.topograph.run/tier-0": "leaf-1", ZONE: "a"}
    return [
        node_object("h200-0", gpus=8, product="NVIDIA-H200", rdma=True, labels=fab),
        node_object("h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", rdma=True, labels=fab),
        node_object("a100-0", gpus=8, product="NVIDIA-A100-SXM4-80GB", rdma=True, labels=fab),
        node_object("l40s-0", gpus=4, product="NVIDIA-L40S", labels={ZONE: "a"}),
        node_object("l4-0", gpus=4, product="NVIDIA-L4", labels={ZONE: "b"}),
        node_object("t4-0", gpus=4, product="Tesla-T4", labels={ZONE: "b"}),
        node_object("cpu-0", cpu="64", memory="512Gi", node_class="cpu", labels={ZONE: "a"}),
        node_object("storage-0", cpu="32", memory="256Gi", node_class="storage", labels={ZONE: "a"}),
    ]


def mixed_service(settings: Settings | None = None, catalog: GpuCatalog | None = None) -> ExtenderService:
    """A service over the mixed cluster; tests needing other policy pass their own settings."""
    svc = ExtenderService(settings or Settings(cluster_source="none", metrics_port=0),
                          catalog or GpuCatalog.load())
    for n in mixed_nodes():
        svc.absorb_node(n)
    return svc


@pytest.fixture
def service(settings: Settings, catalog: GpuCatalog) -> ExtenderService:
    return mixed_service(settings, catalog)
