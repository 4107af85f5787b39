"""Fixtures of the integration suite: one real control plane per session, one namespace per module.

Run with ``pytest -m integration tests/integration``. The first run builds kube-apiserver and
kube-scheduler (scripts/build-controlplane.sh: ~7 min on a fresh 2-core machine including the Go
module download, seconds once Go's caches are warm, nothing once the binaries are cached).

Logs: every component writes to ``<workdir>/logs/`` (workdir under $LLMP_TEST_WORKDIR, else the
system temp dir). It is deleted after a fully green session and kept otherwise (or always, with
LLMP_KEEP_LOGS=1); its path is printed in the terminal summary. A failing test also gets the tail of
every component's log attached to its report.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeharness import (
    BuildError,
    ControlPlane,
    build_binaries,
    create_nodes,
    delete_all_pods,
    delete_nodes,
    ensure_namespace,
    find_binaries,
    list_nodes,
)
from kubeharness.controlplane import metric_value
from kubeharness.procs import tail

# State shared between the fixtures and the reporting hooks of this conftest.
_STATE: dict[str, Any] = {
    "cp": None,
    "workdir": None,
    "build_error": None,
    "build_output": None,
    "startup": None,
}


def _has_integration_items(items: list[pytest.Item]) -> bool:
    return any(item.get_closest_marker("integration") for item in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    # Build before the first test starts: a cold build (~5 min, more with the module download) must
    # not count against a test's timeout. A build failure fails the integration tests only, not a
    # unit-test run that happens to share the session.
    if not _has_integration_items(session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("integration: ensuring control-plane binaries (scripts/build-controlplane.sh)")
    t0 = time.monotonic()
    try:
        _STATE["build_output"] = build_binaries()
    except BuildError as exc:
        _STATE["build_error"] = exc
        return
    if reporter is not None:
        last = (_STATE["build_output"] or "").splitlines()[-1:] or [""]
        reporter.write_line(f"integration: {last[0]} ({time.monotonic() - t0:.0f} s)")


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + our extender + kube-scheduler, started once per session."""
    if _STATE["build_error"] is not None:
        pytest.fail(f"control-plane binaries unavailable: {_STATE['build_error']}", pytrace=False)
    base = os.environ.get("LLMP_TEST_WORKDIR")  # where to put the logs; the system temp dir by default
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="llmp-controlplane-", dir=base))
    _STATE["workdir"] = workdir
    sys.stderr.write(f"\nintegration: control-plane workdir and logs: {workdir}\n")
    cp = ControlPlane(workdir, find_binaries(build=False))
    cp.start()
    _STATE["cp"] = cp
    _STATE["startup"] = "control plane up in {:.1f}s ({})".format(
        cp.timings["total"], ", ".join(f"{k} {v:.1f}s" for k, v in cp.timings.items() if k != "total")
    )
    try:
        yield cp
    finally:
        _STATE["cp"] = None
        cp.stop()
        # A dead component would have made tests fail already; keep everything unless all passed.
        keep = request.session.testsfailed > 0 or os.environ.get("LLMP_KEEP_LOGS") == "1"
        if keep:
            sys.stderr.write(f"\nintegration: logs kept in {workdir / 'logs'}\n")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed or item.get_closest_marker("integration") is None:
        return
    cp: ControlPlane | None = _STATE["cp"]
    if cp is None:
        return
    # The component logs are the only way to see *why* kube-scheduler or the extender did what they
    # did; attach their tails to the failing test's report and point at the full files.
    for c in cp.components():
        state = "running" if c.alive() else f"exited with {c.proc.returncode if c.proc else '?'}"
        report.sections.append((f"{c.name} log ({state}): {c.log_path}", tail(c.log_path, 60)))


AGREEMENT = "llm_placement_scheduler_agreement_total"
AGREEMENT_OUTCOMES = ("top", "tied_top", "lower", "unranked")
AGREEMENT_TARGET = 0.99  # docs/scoring.md: kube-scheduler binds one of our best nodes
_AGREED: dict[str, float] = dict.fromkeys(AGREEMENT_OUTCOMES, 0.0)


def _agreement_now(cp: ControlPlane | None) -> dict[str, float] | None:
    if cp is None or cp.extender is None or not cp.extender.alive():
        return None
    try:
        text = cp.extender_metrics()
    except Exception:
        return None
    return {o: metric_value(text, AGREEMENT, {"outcome": o}) or 0.0 for o in AGREEMENT_OUTCOMES}


@pytest.fixture(autouse=True)
def _count_agreement() -> Iterator[None]:
    """Add up, over the whole suite, how kube-scheduler's binds ranked in our scores.

    Tests restart the extender (its counters start again at 0), so each test's delta is taken from
    the counters before and after it; a counter that went down means a restart, and its value then
    is the delta.
    """
    before = _agreement_now(_STATE["cp"])
    yield
    after = _agreement_now(_STATE["cp"])
    if after is None:
        return
    for o in AGREEMENT_OUTCOMES:
        prev = before[o] if before is not None else 0.0
        _AGREED[o] += after[o] - prev if after[o] >= prev else after[o]


def agreement_ratio() -> tuple[float | None, int]:
    ranked = _AGREED["top"] + _AGREED["tied_top"] + _AGREED["lower"]
    return ((_AGREED["top"] + _AGREED["tied_top"]) / ranked if ranked else None), int(ranked)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A suite-wide quality gate: placements that disagree with our ranking are lost preferences
    # even when every single test's own assertion holds.
    ratio, ranked = agreement_ratio()
    if ratio is not None and ranked >= 50 and ratio < AGREEMENT_TARGET and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _STATE.get("startup"):
        terminalreporter.write_line(f"integration: {_STATE['startup']}")
    ratio, ranked = agreement_ratio()
    if ratio is not None:
        counts = ", ".join(f"{o} {int(_AGREED[o])}" for o in AGREEMENT_OUTCOMES)
        verdict = "ok" if ratio >= AGREEMENT_TARGET or ranked < 50 else "BELOW TARGET (suite fails)"
        terminalreporter.write_line(
            f"integration: kube-scheduler agreement {ratio:.2%} of {ranked} ranked binds "
            f"({counts}); target {AGREEMENT_TARGET:.0%}: {verdict}")
    workdir = _STATE["workdir"]
    if workdir is not None and Path(workdir).exists():
        terminalreporter.write_line(f"integration: component logs kept in {Path(workdir) / 'logs'}")


@pytest.fixture(autouse=True)
def _components_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test: fail it if a component crashed; restart what it stopped on purpose.

    A test that stops the extender or kube-scheduler (restart tests) and then fails half-way must not
    leave the next tests without one.
    """
    yield
    cp: ControlPlane | None = _STATE["cp"]
    if cp is None:
        return
    cp.check_alive()
    if cp.extender is not None and cp.extender.stopped:
        cp.start_extender()
    if cp.scheduler is not None and cp.scheduler.stopped:
        cp.start_scheduler()


class ClusterScope:
    """A namespace and the nodes one test module created; everything is removed at module end.

    Each module gets its own namespace and a node-name prefix, and deletes its nodes afterwards, so
    modules do not see each other's nodes and kube-scheduler always scores only the module's cluster.
    """

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.namespace = namespace
        self.prefix = namespace
        self.nodes: list[str] = []

    @property
    def core(self) -> Any:
        return self.cp.core

    def node_name(self, suffix: str) -> str:
        return f"{self.prefix}-{suffix}"

    def add_nodes(self, manifests: list[dict[str, Any]], workers: int = 8) -> list[str]:
        names = create_nodes(self.core, manifests, workers=workers)
        self.nodes.extend(names)
        self.wait_extender_sees_nodes()
        return names

    def remove_nodes(self, names: list[str]) -> None:
        delete_nodes(self.core, names)
        self.nodes = [n for n in self.nodes if n not in set(names)]
        self.wait_extender_sees_nodes()

    def wait_extender_sees_nodes(self, timeout: float = 30.0) -> None:
        """Wait until the extender's watch-fed cache holds exactly the nodes the API has.

        kube-scheduler sends node names straight from its own informer; if a test created pods
        before the extender's watch delivered the new nodes, the extender would judge names it has
        not seen yet. This barrier keeps that race out of the assertions.
        """
        if self.cp.extender is None or not self.cp.extender.alive():
            return  # stopped by a test; it lists everything afresh when it starts again
        want = len(list_nodes(self.core))
        self.cp.wait_extender_cache_nodes(want, timeout)

    def cleanup(self) -> None:
        delete_all_pods(self.core, self.namespace)
        if self.nodes:
            delete_nodes(self.core, self.nodes)
            self.nodes = []
            self.wait_extender_sees_nodes()


def _module_namespace(module_name: str) -> str:
    # tests.integration.test_serving_placement -> it-serving-placement (DNS-1123, short for node names)
    base = module_name.rsplit(".", 1)[-1].removeprefix("test_")
    return "it-" + re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")[:40]


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[ClusterScope]:
    """A fresh namespace (with its default ServiceAccount) and node bookkeeping for one module."""
    ns = _module_namespace(request.module.__name__)
    ensure_namespace(control_plane.core, ns)
    scope = ClusterScope(control_plane, ns)
    try:
        yield scope
    finally:
        scope.cleanup()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Short unique suffixes for pod names within a module."""
    counter = iter(range(1_000_000))
    stamp = format(int(time.time() * 1000) % 1_000_000, "x")
    return lambda base: f"{base}-{stamp}-{next(counter)}"
