"""The embedded default (`llm-placement demo`) places the bundled workload sensibly."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from app.cli import cli
from app.config import Settings
from app.demo.run import run_demo


def test_demo_placements_follow_the_stage_policy() -> None:
    service, placements = run_demo(Settings(cluster_source="none", metrics_port=0))
    by_pod = {p.pod.split("/")[1]: p for p in placements}
    node_class = {n: f.node_class.value for n, f in service.snapshot.nodes.items()}
    assert node_class[by_pod["tokenize-corpus"].node] in ("storage", "cpu")
    assert node_class[by_pod["quantize-70b"].node] == "cpu"
    chat70 = service.snapshot.nodes[by_pod["chat-70b"].node]
    assert chat70.gpu is not None and chat70.gpu.hbm_bandwidth_tbs >= 3.0
    assert by_pod["chat-7b-int8"].node.startswith("t4-")
    assert by_pod["broken-pod"].node is None and "70Q" in by_pod["broken-pod"].reason
    # No node over-committed.
    for n, facts in service.snapshot.nodes.items():
        assert service.snapshot.usage[n].gpus <= facts.gpu_count


def test_demo_cli_json_and_table() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["demo", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["stage"] for r in rows if r["stage"]} == {"data-prep", "pretraining", "alignment", "deployment", "serving"}
    res = runner.invoke(cli, ["demo"])
    assert res.exit_code == 0 and "pods placed" in res.output


def test_catalog_cli() -> None:
    res = CliRunner().invoke(cli, ["catalog", "--json"])
    assert res.exit_code == 0
    names = {e["name"] for e in json.loads(res.output)}
    assert len(names) >= 12


def test_bad_config_exits_with_named_key(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("port: -1\n")
    res = CliRunner().invoke(cli, ["demo", "--config", str(f)])
    assert res.exit_code == 2 and "port" in res.output
