"""A small soak with faults in CI: ~150 pods of every stage while each control-plane component is
killed (SIGKILL) and restarted once, with poison pods present (kubeharness/soak.py).

The full run is ``make soak`` (bench/soak.py, figures in BENCHMARKS.md). Both check the invariants of
docs/extender-protocol.md (Targets) and docs/gangs.md (Guarantees) on every change the pod watch
brings: no GPU or CPU over-committed, no gang partly bound, no pod bound twice or moved, no pod
Pending past the bound while its pool has room, no reservation left at the end, poison pods unbound.

This module starts its own control plane: it kills etcd and kube-apiserver, which the suite's shared
one must survive untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeharness import ControlPlane, find_binaries
from kubeharness.kwok import Kwok, KwokBuildError, build_kwok
from kubeharness.soak import FAULTS, SoakResult, SoakShape, run_soak

pytestmark = pytest.mark.integration

# One fault of each kind, 5 s apart (plus each restart), while pods of 2-6 s keep arriving: every
# fault lands mid-workload. The pools hold 32 + 16 + 16 GPUs and 128 CPUs.
SHAPE = SoakShape(pods=150, fault_rounds=1, fault_interval_s=5.0, down_s=2.0, min_duration_s=2.0,
                  max_duration_s=6.0, timeout_s=420.0)


@pytest.fixture(scope="module")
def soak() -> Iterator[SoakResult]:
    try:
        kwok_bin = build_kwok()
    except KwokBuildError as exc:
        pytest.fail(f"kwok unavailable: {exc}", pytrace=False)
    base = os.environ.get("LLMP_TEST_WORKDIR")
    if base:
        Path(base).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="llmp-soak-", dir=base))
    cp = ControlPlane(workdir, find_binaries(build=False))
    cp.start()
    kwok = Kwok(kwok_bin, cp.admin_kubeconfig, workdir, pod_stages=False)
    failed = True
    try:
        kwok.start()
        result = run_soak(cp, kwok, "it-soak", SHAPE, log=print)
        failed = result.total_violations > 0
        yield result
    finally:
        kwok.stop()
        cp.stop()
        if failed or os.environ.get("LLMP_KEEP_LOGS") == "1":
            print(f"\nsoak control plane logs kept in {workdir / 'logs'}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def test_every_fault_was_injected_with_poison_pods_present(soak: SoakResult) -> None:
    assert soak.faults == dict.fromkeys(FAULTS, 1), soak.faults
    assert soak.violations["poison_bound"] == 0, soak.examples


def test_no_invariant_is_violated_through_the_faults(soak: SoakResult) -> None:
    assert soak.total_violations == 0, (soak.violations, soak.examples)
    assert soak.reserved_gpus_end == 0


def test_every_pod_of_every_stage_was_placed_and_completed(soak: SoakResult) -> None:
    assert soak.pods >= SHAPE.pods and soak.gangs > 0 and soak.pipelines > 0
    assert soak.placed == soak.pods, f"{soak.pods - soak.placed} pods never bound"
    assert soak.completed == soak.pods, f"{soak.pods - soak.completed} pods did not finish"
