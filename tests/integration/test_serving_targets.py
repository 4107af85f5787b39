"""A serving pod its own engine measures missing its own target gets told so, on the real control
plane (docs/stage-policy.md, "Targets the engines measure missed").

Two serving pods are placed by kube-scheduler through the extender on an L4 node, both admitted
against a 40 ms/token target. A small exporter serves each pod's vLLM histograms (testkit), and a
real Prometheus scrapes them, labelled with the pods' namespace and names as Kubernetes service
discovery would. The extender, started as ``llm-placement serve`` with ``live_profiles`` pointing at
that Prometheus, must write one Warning event on the pod measured at 80 ms/token (none on the one at
20 ms, and no second one however many polls follow), count it in its gauge, say it in explain, and
write one Normal event once the pod meets its target again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.serving.targets import MET_REASON, MISSED_REASON
from kubeharness import (
    ControlPlane,
    create_pod,
    gpu_node,
    llm_pod,
    pod_events,
    wait_for_event,
    wait_for_node_name,
)
from kubeharness.tokens import pod_reader_token
from testkit.engine_exporter import EngineExporter, EnginePod
from tests.prometheus.server import running_prometheus

from .conftest import ClusterScope

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ANN = "llm-placement.io/"


def _reasons(cluster: ClusterScope, name: str, reason: str) -> list[dict[str, object]]:
    return [e for e in pod_events(cluster.core, cluster.namespace, name) if e.get("reason") == reason]


def test_a_pod_missing_its_own_target_gets_one_warning_a_metric_and_an_explain_line(
    cluster: ClusterScope, control_plane: ControlPlane, unique: Callable[[str], str], tmp_path: Path
) -> None:
    cluster.add_nodes([gpu_node(cluster.node_name("l4"), "L4", gpus=4, index=91)])
    ns = cluster.namespace
    slow, fast = unique("slow"), unique("fast")
    exporter = EngineExporter([EnginePod(ns, slow, "vllm", tpot_s=0.080, ttft_s=0.2),
                               EnginePod(ns, fast, "vllm", tpot_s=0.020, ttft_s=0.2)])
    live = {"prometheus_url": "", "interval_seconds": 1, "window_seconds": 30, "min_requests": 1,
            "timeout_seconds": 2, "stale_after_seconds": 120}
    try:
        with running_prometheus(tmp_path / "prometheus", exporter.scrape_configs()) as url, \
                control_plane.extender_settings({"LLMP_LIVE_PROFILES": json.dumps({**live, "prometheus_url": url})}):
            cluster.wait_extender_sees_nodes()
            for name in (slow, fast):
                # 1B at 16 bits on an L4: the estimate meets 40 ms/token with room, so both are placed.
                create_pod(cluster.core, ns, llm_pod(name, stage="serving", model_params="1B", gpus=1,
                                                     max_ms_per_token=40, cpu="2", memory="8Gi"))
            for name in (slow, fast):
                wait_for_node_name(cluster.core, ns, name, timeout=60)

            msg = wait_for_event(cluster.core, ns, slow, MISSED_REASON, "ms/token", timeout=60)
            assert "misses its max-ms-per-token 40" in msg and "80.0 ms/token" in msg
            assert "mean over the 30 s" in msg and "requests" in msg
            (event,) = _reasons(cluster, slow, MISSED_REASON)
            assert event["type"] == "Warning"
            assert event["involvedObject"]["uid"]  # type: ignore[index]  # so kubectl describe shows it
            assert control_plane.metric_value("llm_placement_serving_targets_missed", {"metric": "tpot"}) == 1
            assert control_plane.metric_value(
                "llm_placement_serving_target_misses_total", {"metric": "tpot"}) == 1

            token = pod_reader_token(control_plane.api, ns, "reader")
            got = httpx.get(f"{control_plane.extender_base}/explain/{ns}/{slow}",
                            headers={"Authorization": f"Bearer {token}"}, timeout=15)
            assert got.status_code == 200, got.text
            lines = got.json()["serving_targets"]
            assert lines and lines[0].startswith("misses its max-ms-per-token 40"), lines

            time.sleep(5)  # five more polls, all still missing: still one event
            assert len(_reasons(cluster, slow, MISSED_REASON)) == 1
            assert _reasons(cluster, fast, MISSED_REASON) == []

            # The engine gets faster: once two windows agree under the target, one Normal event.
            exporter.set(ns, slow, tpot_s=0.010)
            msg = wait_for_event(cluster.core, ns, slow, MET_REASON, "meets its max-ms-per-token 40",
                                 timeout=90)
            (event,) = _reasons(cluster, slow, MET_REASON)
            assert event["type"] == "Normal"
            assert control_plane.metric_value("llm_placement_serving_targets_missed", {"metric": "tpot"}) == 0

            # The same windows, read back by `calibrate --from-prometheus` with the extender's own
            # credentials: both pods are attributed through the API server (their annotations, the
            # L4 node), not through a file.
            got = subprocess.run(
                [sys.executable, "-m", "app.cli", "calibrate", "--from-prometheus", url, "--kubeconfig",
                 str(control_plane.extender_kubeconfig), "--window", "4s", "--lookback", "60s",
                 "--min-requests", "10"], capture_output=True, text=True, timeout=120,
                env={"PATH": "/usr/bin:/bin", "COLUMNS": "240"}, cwd=Path(__file__).resolve().parents[2])
            assert got.returncode == 0, got.stderr
            assert "from 2 pods (vllm)" in got.stdout, got.stdout
    finally:
        exporter.close()
