"""Synthetic GPU fleets with realistic topology and free-capacity patterns (benchmark, property tests).

Shapes follow the NVIDIA Topograph fixtures (``large``, ``dual-xclr-irregular``, ``nvl72``): leaves of
8-32 nodes under spines, spines under zones/blocks, some leaves partly populated, optional NVL72-style
NVLink cliques spanning a whole leaf. Usage is correlated the way clusters look after a while: whole
leaves taken by earlier training gangs, partly used nodes scattered by small jobs, a few nodes free.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from app.gang.problem import Candidate, Problem, Shape

TIERS = ("nvlink", "fabric-tier-0", "fabric-tier-1", "fabric-tier-2")


@dataclass(frozen=True, slots=True)
class FleetSpec:
    nodes: int
    gpus_per_node: int = 8
    leaf_size: tuple[int, int] = (16, 32)  # nodes per leaf (min, max): irregular leaves
    leaves_per_spine: int = 8
    spines_per_zone: int = 4
    busy_leaf_share: float = 0.35  # leaves fully taken by earlier gangs
    partial_share: float = 0.25  # nodes with some GPUs in use
    full_share: float = 0.25  # other nodes fully in use
    non_rdma_share: float = 0.03
    nvl_cliques: bool = False  # NVL72-style: a leaf is one NVLink domain
    models: tuple[str, ...] = ("H100",)


def fleet(spec: FleetSpec, rng: random.Random) -> list[Candidate]:
    """Nodes with paths ``(nvlink, leaf, spine, zone)`` and free GPUs after earlier jobs."""
    nodes: list[Candidate] = []
    leaf = spine = zone = 0
    in_spine = in_zone = 0
    while len(nodes) < spec.nodes:
        size = min(rng.randint(*spec.leaf_size), spec.nodes - len(nodes))
        busy_leaf = rng.random() < spec.busy_leaf_share
        model = spec.models[zone % len(spec.models)]
        for _ in range(size):
            name = f"n{len(nodes):05d}"
            total = spec.gpus_per_node
            r = rng.random()
            if busy_leaf or r < spec.full_share:
                free = 0
            elif r < spec.full_share + spec.partial_share:
                free = rng.randint(1, total - 1)
            else:
                free = total
            nvlink = f"clique-{leaf}" if spec.nvl_cliques else name
            nodes.append(Candidate(
                name=name,
                path=(nvlink, f"leaf-{leaf}", f"spine-{spine}", f"zone-{zone}"),
                free_gpus=free,
                total_gpus=total,
                gpu_model=model,
                rdma=rng.random() >= spec.non_rdma_share,
                cost_rank=spec.models.index(model),
            ))
        leaf += 1
        in_spine += 1
        if in_spine >= spec.leaves_per_spine:
            in_spine = 0
            spine += 1
            in_zone += 1
            if in_zone >= spec.spines_per_zone:
                in_zone = 0
                zone += 1
    return nodes


def gang_problem(nodes: list[Candidate], pods: int, gpus: int, name: str = "bench/gang") -> Problem:
    """A gang of ``pods`` identical members; nodes with no room for one member are context only
    (their free/used GPUs still count in the domain figures), as the extender builds it."""
    empty: frozenset[str] = frozenset()
    cands = tuple(n if n.free_gpus >= gpus else replace(n, shapes=empty) for n in nodes)
    return Problem(name, (Shape("member", pods, gpus),), cands, TIERS)
