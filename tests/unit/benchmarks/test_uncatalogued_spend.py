"""GPUs the catalog lacks never raise the bill: the same pods cost no more with them in the cluster than
with every one of them removed, and none lands on one while a catalogued GPU that would truly run it
for less is free (bench/uncatalogued_spend.py, what-if simulator)."""

from __future__ import annotations

import pytest

from app.base.catalog import GpuCatalog
from bench.uncatalogued_spend import (
    UNKNOWN,
    compare,
    fresh_jobs,
    fresh_nodes,
    simulate,
    without_uncatalogued,
)


@pytest.mark.parametrize("seed", [1, 2])
def test_uncatalogued_gpus_never_raise_the_dollars_spent(seed: int) -> None:
    nodes, truth = fresh_nodes()
    jobs = fresh_jobs(seed, count=80, hours=96)
    as_is, removed = compare(nodes, truth, jobs, seed=seed)
    assert as_is.placed == removed.placed == len(jobs)  # the same work in both runs
    assert as_is.dollars <= removed.dollars
    assert as_is.misplaced == 0, as_is.misplaced_dollars
    # The uncatalogued GPUs were used (the comparison is not vacuous), the truly slow unlabelled one not.
    used = {p for p, h in as_is.gpu_hours.items() if h > 0}
    assert "ACME-Declared-Fast" in used
    assert "ACME-Unlabelled-Slow" not in used


def test_the_measurement_sees_unknown_gpus_raise_spend_where_they_do() -> None:
    # Without the extender (kube-scheduler's default profile spreads by free capacity) the same pods
    # land on the slow uncatalogued GPUs and cost more: the measurement can tell.
    nodes, truth = fresh_nodes()
    jobs = fresh_jobs(1, count=80, hours=96)
    as_is, removed = compare(nodes, truth, jobs, extender=False, seed=1)
    assert as_is.dollars > removed.dollars and as_is.misplaced > 0


def test_removal_takes_exactly_the_uncatalogued_products() -> None:
    nodes, truth = fresh_nodes()
    kept = without_uncatalogued(nodes, GpuCatalog.load())
    products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in kept}
    assert products.isdisjoint({p for p, *_ in UNKNOWN}) and len(products) == 4
    assert len(nodes) - len(kept) == sum(count for _, count, *_ in UNKNOWN)
    assert simulate(kept, truth, []).dollars == 0.0
