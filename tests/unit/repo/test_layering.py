"""Imports in app/ go one way: down the declared layers (README, "Layout").

Each layer is a tuple of parts; a part is a tuple of module prefixes. A module may import its own
part or any part of a lower layer, never a sibling part of its own layer nor anything above. The
graph is read with ``ast`` from the source (function-local and TYPE_CHECKING imports included: a
dependency is a dependency wherever it is written).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[3] / "app"

LAYERS: tuple[tuple[tuple[str, ...], ...], ...] = (
    # The base every part reads: units, reasons, data files, the GPU and model catalogs, the workload
    # spec, object files, rate-limited warnings. ``app`` and ``app.config`` themselves hold no code.
    (("app", "app.data", "app.base", "app.config"),),
    # Over the base, independent of each other: the serving model's estimates and measured profiles,
    # kube-scheduler's score bands (the ranking policy names one), the extender wire types.
    (("app.serving",), ("app.placement.ranking",), ("app.api.wire",)),
    # The typed policies each pure part reads. Parts take these, never the settings file.
    (("app.config.policy",),),
    # Over the policies: DRA objects read as GPUs; profiles learnt from the engines and serving targets.
    (("app.dra",), ("app.serving.live_profiles", "app.serving.targets")),
    # Node facts and the cluster snapshot (DRA devices included).
    (("app.snapshot",),),
    # Filter, score, rank, narrow, place; data gravity.
    (("app.placement",),),
    # Pure parts over placement, independent of each other: gangs, the simulator, the workflow planner,
    # the metric set and quality gauges, each pod's decisions.
    (("app.gang",), ("app.sim",), ("app.plan",), ("app.metrics",), ("app.bind", "app.bind.decisions")),
    # Offline calibration of the serving model (reads measurement files, incl. profiles_import's).
    (("app.calibration",),),
    # Kubernetes adapters: watches, binder, REST; the gang objects' watch and the planner's --live
    # reader live beside the part they feed but belong here.
    (("app.cluster", "app.gang.kube", "app.plan.live"),),
    # The settings file.
    (("app.config.settings",),),
    # The decision path, bottom up: one bind, who may bind, the service, explain, the wiring.
    (("app.bind.binding",),),
    (("app.bind.gate",),),
    (("app.extender", "app.extender.service"),),
    (("app.extender.explain",),),
    (("app.extender.wiring",),),
    # Entry points: HTTP, the demo, the offline commands.
    # (calibrate --from-prometheus reads Prometheus and the cluster: an entry point like its command.)
    (("app.api",), ("app.demo",), ("app.plan.cli",),
     ("app.calibration.command", "app.calibration.from_prometheus"), ("app.config.docs",)),
    (("app.cli",),),
)

# Upward imports kept on purpose, each with its reason: (importer, imported) -> why.
EXCEPTIONS: dict[tuple[str, str], str] = {}

# Frameworks that only adapters and entry points may import.
FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "kubernetes")
ADAPTER_LAYER = 8  # the Kubernetes adapters' layer; below it, no framework
PLACEMENT_LAYER = 5  # base up to placement: the pure placement logic the demo and simulator run
# The placement logic is pure: none of these (and, by the layers, nothing of app above it).
CORE_FORBIDDEN = (*FRAMEWORKS, "prometheus_client", "typer", "rich", "httpx")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(APP.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from app.gang import kube`` imports the module app.gang.kube (and the package's
            # docstring-only __init__, which is no dependency); ``from app.gang.kube import X`` the module.
            modules = {f"{base}.{alias.name}" for alias in node.names
                       if (APP.parent / f"{base}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()
                       or (APP.parent / f"{base}.{alias.name}".replace(".", "/")).is_dir()}
            found.update(modules or {base})
    return found


@cache
def _graph() -> dict[str, set[str]]:
    return {_module_of(p): _imports(p) for p in sorted(APP.rglob("*.py"))}


def _part_of(module: str) -> tuple[int, tuple[str, ...]] | None:
    """(layer, part) of the longest declared prefix naming ``module``; None when undeclared."""
    best: tuple[int, int, tuple[str, ...]] | None = None
    for layer, parts in enumerate(LAYERS):
        for part in parts:
            for prefix in part:
                named = module == prefix or (prefix != "app" and module.startswith(prefix + "."))
                if named and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), layer, part)
    return None if best is None else (best[1], best[2])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imported in graph.items():
        here = _part_of(module)
        assert here is not None
        for target in sorted(imported):
            if target != "app" and not target.startswith("app."):
                continue
            there = _part_of(target)
            assert there is not None, f"{module} imports {target}, which no layer declares"
            if there[1] == here[1] or there[0] < here[0] or (module, target) in EXCEPTIONS:
                continue
            kind = "a sibling" if there[0] == here[0] else "a higher layer"
            bad.append(f"{module} (layer {here[0]}) imports {target} ({kind}, layer {there[0]})")
    return bad


def test_every_module_is_declared() -> None:
    undeclared = [m for m in _graph() if _part_of(m) is None]
    assert not undeclared, f"modules in no layer (add them to LAYERS): {undeclared}"


def test_imports_go_down_the_layers() -> None:
    bad = upward_imports(_graph())
    assert not bad, "upward imports:\n  " + "\n  ".join(bad)


def test_exceptions_are_still_needed() -> None:
    graph = _graph()
    stale = [edge for edge in EXCEPTIONS if edge[1] not in graph.get(edge[0], set())]
    assert not stale, f"declared exceptions no longer imported, remove them: {stale}"


def _external_imports(modules: list[str], names: tuple[str, ...]) -> list[str]:
    graph = _graph()
    return [f"{m} imports {t}" for m in modules for t in sorted(graph[m])
            if t.split(".")[0] in names]


def test_placement_logic_is_pure() -> None:
    core = [m for m in _graph() if (part := _part_of(m)) is not None and part[0] <= PLACEMENT_LAYER]
    assert {"app.base.workload", "app.placement.placer", "app.dra.index"} <= set(core)
    bad = _external_imports(core, CORE_FORBIDDEN)
    assert not bad, "\n".join(bad)


def test_no_framework_below_the_adapters() -> None:
    low = [m for m in _graph() if (part := _part_of(m)) is not None and part[0] < ADAPTER_LAYER]
    bad = _external_imports(low, FRAMEWORKS)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(("importer", "imported", "upward"), [
    ("app.base.units", "app.metrics.metrics", True),         # the base reaching up
    ("app.cluster.cache", "app.config.settings", True),      # an adapter reading the whole settings file
    ("app.gang.planning", "app.plan.problem", True),         # sibling pure parts
    ("app.serving.model", "app.serving.live_profiles", True),  # a folder's lower part reaching its upper
    ("app.dra.index", "app.snapshot.store", True),           # DRA is below the snapshot
    ("app.placement.ranking", "app.placement.scoring", True),
    ("app.bind.binding", "app.bind.gate", True),             # the decision path, top down
    ("app.gang.kube", "app.cluster.reflector", False),       # one part
    ("app.extender.service", "app.config.settings", False),
    ("app.placement.placer", "app.snapshot.store", False),
    ("app.serving.targets", "app.config.policy", False),
    ("app.cli", "app.api.app", False),
])
def test_the_rule_itself(importer: str, imported: str, upward: bool) -> None:
    assert bool(upward_imports({importer: {imported}})) is upward
