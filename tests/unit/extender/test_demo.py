"""The embedded default (`llm-placement demo`) places the bundled workload sensibly."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from app.base.catalog import normalize
from app.base.objects import load_yaml
from app.cli import cli
from app.config.settings import API_VERSION, KIND, Settings
from app.demo.run import EXAMPLE_PROFILES, run_demo, with_profiles
from app.extender.explain import explain_spec
from app.extender.service import ExtenderService
from app.serving.model import serving_estimate
from app.sim.scheduler import Placement


def test_demo_placements_follow_the_stage_policy() -> None:
    service, placements = run_demo(Settings(cluster_source="none", metrics_port=0))
    by_pod = {p.pod.split("/")[1]: p for p in placements}
    node_class = {n: f.node_class.value for n, f in service.snapshot.nodes.items()}
    assert node_class[by_pod["tokenize-corpus"].node] in ("storage", "cpu")
    assert node_class[by_pod["quantize-70b"].node] == "cpu"
    chat70 = service.snapshot.nodes[by_pod["chat-70b"].node]
    assert chat70.gpu is not None and chat70.gpu.hbm_bandwidth_tbs >= 3.0
    # No max-ms-per-token: held to the default interactive target (50 ms/token) because nodes that
    # meet it exist; a T4 (60 ms/token predicted) and an L4 are cheaper but too slow.
    chat7 = by_pod["chat-7b-int8"]
    assert chat7.ms_per_token is not None and chat7.ms_per_token <= 50
    assert by_pod["broken-pod"].node is None and "70Q" in by_pod["broken-pod"].reason
    # No node over-committed.
    for n, facts in service.snapshot.nodes.items():
        assert service.snapshot.usage[n].gpus <= facts.gpu_count


def _demo(**kw: object) -> tuple[ExtenderService, dict[str, Placement]]:
    service, placements = run_demo(Settings(cluster_source="none", metrics_port=0), **kw)  # type: ignore[arg-type]
    return service, {p.pod.split("/")[1]: p for p in placements}


def test_demo_lora_sft_fits_one_mid_size_gpu() -> None:
    """A LoRA SFT of a 7B model on one GPU lands on a 24-48 GB GPU (full fine-tuning would need
    ~156 GB per GPU: the pod would stay pending)."""
    service, by_pod = _demo()
    lora = by_pod["sft-7b-lora"]
    assert lora.node is not None, lora.reason
    assert lora.spec is not None and lora.spec.gpus == 1
    gpu = service.snapshot.nodes[lora.node].gpu
    assert gpu is not None and 24 <= gpu.memory_gb <= 48, gpu
    assert lora.fit is not None and lora.fit.sizing.per_gpu_gb <= gpu.memory_gb


def test_demo_moe_is_placed_by_its_active_experts() -> None:
    """The mixture of experts meets its ms/token target on an L4, whose bandwidth could not read every
    expert's weights in that time: feasibility rests on the active parameters. (Where it lands also
    depends on which nodes are partly used by then, docs/scoring.md "Across shapes".)"""
    settings = Settings(cluster_source="none", metrics_port=0)
    service, by_pod = _demo()
    moe = by_pod["moe-30b-a3b"]
    assert moe.node is not None and moe.fit is not None and moe.spec is not None, moe.reason
    target = moe.spec.max_ms_per_token
    assert target is not None and moe.ms_per_token is not None and moe.ms_per_token <= target
    l4 = [e for e in explain_spec(service, moe.spec)["nodes"] if e.get("gpu") == "L4"]
    assert l4 and all(e["feasible"] and e["ms_per_token"] <= target for e in l4), l4
    gpu = service.snapshot.nodes[l4[0]["node"]].gpu
    assert gpu is not None
    sizing = moe.fit.sizing
    assert sizing.read_gb is not None and sizing.read_gb < sizing.weights_gb
    # The same pod read as a dense model of its total size (every expert every step) misses it.
    dense = moe.spec.model_copy(update={"active_params": None})
    every_expert = serving_estimate(dense, sizing.precision, gpu, gpu.hbm_bandwidth_tbs,
                                    settings.policies().placement.feasibility)
    assert every_expert.ms_per_token > target, every_expert.ms_per_token


def test_demo_prefill_decode_pair_shares_a_domain(tmp_path) -> None:
    """The prefill pod goes where its time-to-first-token target is met; its decode partner lands in
    the same NVLink domain or leaf switch, though cheaper GPUs elsewhere meet its own needs."""
    service, by_pod = _demo()
    prefill, decode = by_pod["chat-8b-prefill"], by_pod["chat-8b-decode"]
    assert prefill.node is not None and decode.node is not None, (prefill.reason, decode.reason)
    assert prefill.fit is not None and prefill.fit.ttft_ms is not None and prefill.spec is not None
    assert prefill.spec.max_ttft_ms is not None and prefill.fit.ttft_ms <= prefill.spec.max_ttft_ms
    p_node, d_node = service.snapshot.nodes[prefill.node], service.snapshot.nodes[decode.node]
    same_nvlink = p_node.nvlink_domain == d_node.nvlink_domain
    same_leaf = bool(p_node.fabric and p_node.fabric[0]) and p_node.fabric[:1] == d_node.fabric[:1]
    assert same_nvlink or same_leaf, (prefill.node, decode.node)
    # A decode pod with the same needs and no partner goes elsewhere: the group placed it.
    service2, alone = _demo(workload=_workload_without_group(tmp_path, "chat-8b-decode"))
    lone = alone["chat-8b-decode"]
    assert lone.node is not None
    lone_node = service2.snapshot.nodes[lone.node]
    assert lone_node.nvlink_domain != p_node.nvlink_domain
    assert not (p_node.fabric[:1] == lone_node.fabric[:1] and p_node.fabric[0])


def _workload_without_group(tmp_path: Path, pod: str) -> Path:
    """The embedded workload with ``pod`` out of its serving group (a plain serving pod)."""
    data = load_yaml(None, "workload.yaml")
    for p in data["pods"]:
        if p["name"] == pod:
            ann = p["annotations"]
            for key in ("serving-group", "serving-role", "colocation"):
                ann.pop(f"llm-placement.io/{key}")
    out = tmp_path / "workload.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def test_demo_measured_profile_changes_a_decision() -> None:
    """The bundled example profile (an 8B int8 model on one L4) replaces the estimate, and the pod
    goes to an L4; on the estimate alone the L4 misses the pod's 44 ms target and it goes elsewhere."""
    service, by_pod = _demo()
    measured = by_pod["assistant-8b-int8"]
    assert measured.node is not None and measured.fit is not None, measured.reason
    assert measured.fit.ms_source == "measured" and measured.fit.profile is not None
    profile = measured.fit.profile
    assert measured.ms_per_token == profile.ms_per_token
    gpu = service.snapshot.nodes[measured.node].gpu
    assert gpu is not None and normalize(profile.gpu) in {normalize(gpu.name), *map(normalize, gpu.aliases)}
    est = measured.fit.estimated_ms_per_token
    target = measured.spec.max_ms_per_token if measured.spec else None
    assert est is not None and target is not None and est > target >= measured.ms_per_token
    # Without the profiles file the same pod lands on another GPU product, by the estimate.
    service2, unmeasured = _demo(profiles=None)
    other = unmeasured["assistant-8b-int8"]
    assert other.node is not None and other.fit is not None and other.fit.ms_source == "estimated"
    other_gpu = service2.snapshot.nodes[other.node].gpu
    assert other_gpu is not None and other_gpu.name != gpu.name


def test_demo_settings_profiles_file_wins_over_the_example(tmp_path) -> None:
    """A profiles file named in the settings is the one used; the example fills in only without one."""
    own = tmp_path / "p.yaml"
    own.write_text("profiles:\n- {model: mine, model_params: 70B, gpu: H200, precision: bf16, gpus: 4,"
                   " ms_per_token: 12}\n")
    settings = Settings(cluster_source="none", metrics_port=0, profiles_file=str(own))
    assert with_profiles(settings, EXAMPLE_PROFILES) is settings
    _, placements = run_demo(settings)
    by_pod = {p.pod.split("/")[1]: p for p in placements}
    assert by_pod["assistant-8b-int8"].fit is not None
    assert by_pod["assistant-8b-int8"].fit.ms_source == "estimated"
    chat = by_pod["chat-70b"]
    assert chat.fit is not None and chat.fit.profile is not None and chat.fit.profile.model == "mine"
    # The same through the command line's --profiles.
    res = CliRunner().invoke(cli, ["demo", "--json", "--profiles", str(own)])
    assert res.exit_code == 0, res.output
    source = {r["pod"]: r["ms_per_token_source"] for r in json.loads(res.stdout)}
    assert source["default/chat-70b"] == "measured" and source["default/assistant-8b-int8"] == "estimated"
    # --profiles wins over the settings' own file; a bad one is a configuration error.
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"apiVersion: {API_VERSION}\nkind: {KIND}\nprofiles_file: {EXAMPLE_PROFILES}\n")
    res = CliRunner().invoke(cli, ["demo", "--json", "--config", str(cfg), "--profiles", str(own)])
    assert res.exit_code == 0, res.output
    source = {r["pod"]: r["ms_per_token_source"] for r in json.loads(res.stdout)}
    assert source["default/assistant-8b-int8"] == "estimated"
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles:\n- {model: x, model_params: 8B, gpu: L4, precision: int9, ms_per_token: 3}\n")
    res = CliRunner().invoke(cli, ["demo", "--profiles", str(bad)])
    assert res.exit_code == 2 and "profiles_file" in res.output


def test_demo_cli_json_and_table() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["demo", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["stage"] for r in rows if r["stage"]} == {"data-prep", "pretraining", "alignment", "deployment", "serving"}
    # Each figure says whether it was measured (the bundled example profile) or estimated.
    row = next(r for r in rows if r["pod"] == "default/assistant-8b-int8")
    assert row["ms_per_token_source"] == "measured" and "measured" in row["notes"][0]
    assert next(r for r in rows if r["pod"] == "default/chat-70b")["ms_per_token_source"] == "estimated"
    res = runner.invoke(cli, ["demo"])
    assert res.exit_code == 0 and "pods placed" in res.output
    # The table is a simulation, and its first line says so and names the profile replayed.
    first = res.output.strip().splitlines()[0]
    assert first.startswith("what-if (simulator)"), first
    assert "shipped" in " ".join(res.output.split()[:40])


def test_catalog_cli() -> None:
    res = CliRunner().invoke(cli, ["catalog", "--json"])
    assert res.exit_code == 0
    names = {e["name"] for e in json.loads(res.stdout)}
    assert len(names) >= 12


def test_bad_config_exits_with_named_key(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("port: -1\n")
    res = CliRunner().invoke(cli, ["demo", "--config", str(f)])
    assert res.exit_code == 2 and "port" in res.output


def test_explain_cli_renders_a_live_extender(monkeypatch, tmp_path) -> None:
    """`llm-placement explain` against a real HTTP server running the service."""
    import threading

    import uvicorn

    from app.api.app import create_app
    from app.base.catalog import GpuCatalog
    from app.base.objects import expand_cluster, expand_workload, load_yaml
    from app.extender.wiring import build_core

    service = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for n in expand_cluster(load_yaml(None, "cluster.yaml")):
        service.absorb_node(n)
    pods = expand_workload(load_yaml(None, "workload.yaml"))
    chat = next(p for p in pods if p["metadata"]["name"] == "chat-70b")
    service.snapshot.track_spec(service.placer.parse(chat))
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_level="error"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    import time

    for _ in range(100):
        if server.started:
            break
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        res = CliRunner().invoke(cli, ["explain", "default/chat-70b", "--url", f"http://127.0.0.1:{port}", "--json"])
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        assert data["chosen"].startswith("h100-")  # cheapest node that meets 30 ms/token
        reasons = {e["reason"] for e in data["nodes"] if not e["feasible"]}
        assert any("ms/token" in r for r in reasons)
        res = CliRunner().invoke(cli, ["explain", "default/chat-70b", "--url", f"http://127.0.0.1:{port}"])
        assert res.exit_code == 0 and "best node h100-" in res.output
        res = CliRunner().invoke(cli, ["explain", "default/missing", "--url", f"http://127.0.0.1:{port}"])
        assert res.exit_code == 1 and "404" in res.output
    finally:
        server.should_exit = True
        t.join(5)


def test_explain_finds_pods_seen_only_in_filter_requests() -> None:
    import orjson

    from app.base.catalog import GpuCatalog
    from app.base.objects import node_object, pod_object
    from app.extender.explain import explain_pod
    from app.extender.wiring import build_core

    service = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    nodes = [node_object("t4", gpus=4, product="Tesla-T4"), node_object("h100", gpus=8, product="NVIDIA-H100-80GB-HBM3")]
    pod = pod_object("chat", namespace="ml", stage="serving", gpus=1, annotations={"llm-placement.io/model-params": "13B"})
    assert explain_pod(service, "ml", "chat") is None
    service.filter(orjson.dumps({"Pod": pod, "Nodes": {"items": nodes}, "NodeNames": None}))
    out = explain_pod(service, "ml", "chat")
    assert out is not None and out["chosen"] == "h100"
    assert "GPU memory too small" in next(e["reason"] for e in out["nodes"] if e["node"] == "t4")


def test_a_bad_cluster_or_workload_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bomb = tmp_path / "alias.yaml"
    bomb.write_text('a: &a ["x"]\nnodes: *a\n')
    missing = tmp_path / "missing.yaml"
    for option, path, words in (("--cluster", bomb, "aliases"), ("--workload", missing, "cannot read")):
        got = CliRunner().invoke(cli, ["demo", option, str(path)])
        assert got.exit_code == 2, got.output
        assert words in got.output and "Traceback" not in got.output
