"""``llm-placement calibrate --from-prometheus URL`` against a real Prometheus (docs/stage-policy.md,
"Calibrating from your cluster").

Four serving pods' vLLM histograms are served by a small exporter (testkit) and scraped by Debian's
``prometheus``, labelled with each pod's namespace and name. Each engine runs twice as slow as the
serving model estimates, so the shipped distribution accepts targets the pods miss by a third. The
command, run as a user runs it (a child process), must read the windows back, print the before /
after table, and write a calibration that the extender loads and that refuses those targets; bad
URLs, an unreachable or wrong server and no data must be one line on stderr and exit status 2.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import Precision, parse_workload
from app.config.settings import Settings
from app.extender.wiring import build_core
from app.serving.model import ServingCalibration, default_calibration, serving_estimate
from kubeharness import free_port
from testkit.engine_exporter import EngineExporter, EnginePod
from tests.prometheus.server import running_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ANN = "llm-placement.io/"
NS = "serve"
PODS = [f"chat-{i}" for i in range(4)]
SLOWER = 2.0  # measured / estimate on this cluster
PROMPT = 512  # what vllm:request_prompt_tokens reports
CATALOG = GpuCatalog.load()
L4 = CATALOG.lookup("NVIDIA-L4")
assert L4 is not None


def chat_pod(name: str, **extra: str) -> dict[str, Any]:
    pod = pod_object(name, namespace=NS, stage="serving", gpus=1, uid=f"uid-{name}", annotations={
        ANN + "model-params": "1B", ANN + "prompt-tokens": str(PROMPT), **extra})
    pod["spec"]["nodeName"] = "l4-node"
    pod["kind"] = "Pod"
    return pod


def estimates() -> tuple[float, float]:
    """The shipped model's ms/token and first-token ms for the pods (what SLOWER multiplies)."""
    policy = Settings(cluster_source="none").policies().placement.feasibility
    est = serving_estimate(parse_workload(chat_pod("x")), Precision.BF16, L4, L4.hbm_bandwidth_tbs, policy)
    return est.ms_per_token, est.ttft_ms


@dataclass
class Cluster:
    url: str
    pods_file: Path
    exporter_url: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("calibrate-from-prometheus")
    tpot_ms, ttft_ms = estimates()
    exporter = EngineExporter([EnginePod(NS, p, "vllm", tpot_s=SLOWER * tpot_ms / 1000,
                                         ttft_s=SLOWER * ttft_ms / 1000, prompt_tokens=PROMPT)
                               for p in PODS])
    node = {**node_object("l4-node", gpus=4, product="NVIDIA-L4"), "kind": "Node"}
    pods_file = work / "cluster.yaml"
    pods_file.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                         "items": [node, *(chat_pod(p) for p in PODS)]}))
    try:
        with running_prometheus(work / "prometheus", exporter.scrape_configs(), interval="500ms") as url:
            time.sleep(24)  # a dozen 2 s windows per pod
            yield Cluster(url, pods_file, f"http://127.0.0.1:{exporter.port}")
    finally:
        exporter.close()


def calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", "calibrate", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "COLUMNS": "240"})


def test_refits_from_the_clusters_engines_prints_the_table_and_writes_a_file_the_extender_loads(
        cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "cluster-calibration.yaml"
    got = calibrate("--from-prometheus", cluster.url, "--pods", str(cluster.pods_file), "--window", "2s",
                    "--lookback", "30s", "--min-requests", "10", "--out", str(out))
    assert got.returncode == 0, got.stderr
    text = got.stdout
    assert "steady windows from 4 pods (vllm)" in text
    table = [line for line in text.splitlines() if line.strip().startswith(("│ tpot", "│ ttft", "| tpot"))]
    assert table, text
    tpot = next(line for line in table if "tpot" in line)
    cells = [c.strip() for c in tpot.strip("│| ").split("│")]
    # metric, group, windows, pods, quantile before, FR, FA, quantile after, FR, FA
    assert cells[0] == "tpot" and cells[3] == "4"
    assert cells[6] == "100%", cells  # before: every target missed by a third is accepted
    assert cells[9] == "0%" and cells[8] == "0%", cells  # after: refused, and none met is refused
    assert cells[4].startswith("q70") and cells[7].startswith("q70 2.0"), cells
    assert re.search(r"refitted from this cluster: tpot 1 client \(\d+\), tpot all", text), text

    refitted = ServingCalibration.load(out)
    all_tpot = refitted.error_quantiles["tpot"]["all"]
    assert all_tpot.at(0.7) == pytest.approx(SLOWER, rel=0.02) and all_tpot.n >= 20
    assert refitted.provenance["from_prometheus"]["pods"] == 4
    # Groups the cluster has no say in keep the shipped distribution.
    assert refitted.error_quantiles["tpot"]["moe"] == default_calibration().error_quantiles["tpot"]["moe"]

    # The extender loads the file, and a target the engines miss by a third is now refused.
    tpot_ms, _ = estimates()
    target = f"{0.75 * SLOWER * tpot_ms:.3f}"
    pod = parse_workload(chat_pod("next", **{ANN + "max-ms-per-token": target}))
    for path, placed in ((None, True), (str(out), False)):
        svc = build_core(Settings(cluster_source="none", metrics_port=0, serving_calibration_file=path),
                         CATALOG)
        svc.absorb_node(node_object("l4-node", gpus=4, product="NVIDIA-L4"))
        fits, _ = svc.placer.evaluate_nodes(pod, ["l4-node"])
        assert ("l4-node" in fits) is placed, path


@pytest.mark.parametrize(("args", "says"), [
    (["--from-prometheus", "not a url"], "is not an http(s) URL"),
    (["--from-prometheus", "ftp://prometheus:9090"], "is not an http(s) URL"),
    (["--from-prometheus", "UNREACHABLE"], "cannot read Prometheus"),
    (["--from-prometheus", "EXPORTER"], "cannot read Prometheus"),  # an HTTP server, not Prometheus
    (["--from-prometheus", "PROM", "--pod-label", "container"], "no serving-engine latency series"),
    (["--from-prometheus", "PROM", "--pods", "EMPTY"], "none is a running GPU serving pod"),
    (["--from-prometheus", "PROM", "--min-requests", "1000000"], "no steady window"),
    (["--from-prometheus", "PROM", "--window", "ten"], "is not a duration"),
    (["--from-prometheus", "PROM", "--window", "1h", "--lookback", "1h"], "at least two windows"),
    (["--from-prometheus", "PROM", "--pods", "MISSING"], "MISSING"),
])
def test_bad_url_unreachable_and_no_data_are_one_line_and_exit_2(
        cluster: Cluster, tmp_path: Path, args: list[str], says: str) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    swap = {"UNREACHABLE": f"http://127.0.0.1:{free_port()}", "EXPORTER": cluster.exporter_url,
            "PROM": cluster.url, "EMPTY": str(empty), "MISSING": str(tmp_path / "MISSING.yaml")}
    argv = [swap.get(a, a) for a in args]
    for option, value in (("--pods", str(cluster.pods_file)), ("--window", "2s"), ("--lookback", "30s")):
        if option not in argv:
            argv += [option, value]
    got = calibrate(*argv)
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert says in got.stderr, got.stderr
    assert "Traceback" not in got.stderr + got.stdout
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr
