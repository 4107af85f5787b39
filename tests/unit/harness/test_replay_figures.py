"""The replay's per-variant figures (bench/replay.py), on hand-made placements and samples.

Interactive serving is judged by the serving corpus's measurements (never by the extender's own
estimate), stranded GPUs are priced, and stranding is split into what the load forces and what a
placement adds beyond perfect packing.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest
import typer

from app.base.objects import node_object, pod_object
from kubeharness.replay import ReplayPod, ReplayResult, Sample, _TimeWeighted, packing_bound

ANN = "llm-placement.io/"


@pytest.fixture(scope="module")
def bench_replay() -> ModuleType:
    return importlib.import_module("bench.replay")


def _chat(name: str, params: str, target_ms: str | None = None) -> ReplayPod:
    ann = {ANN + "model-params": params, ANN + "precision": "int8"}
    if target_ms:
        ann[ANN + "max-ms-per-token"] = target_ms
    pod = pod_object(name, namespace="pipelines", stage="serving", gpus=1, uid="u-" + name, annotations=ann)
    return ReplayPod(pod, duration=3600.0)


def _sample(stranded: dict[str, int]) -> Sample:
    return Sample(1, 0.0, 0.0, 0, 0, sum(stranded.values()), 0, 0, 0, 0, 0, stranded)


def test_interactive_serving_judged_by_measurement_and_stranded_dollars(bench_replay: ModuleType) -> None:
    nodes = [node_object("l4-0", gpus=4, product="NVIDIA-L4", cpu="48", memory="192Gi"),
             node_object("l40s-0", gpus=4, product="NVIDIA-L40S", cpu="48", memory="192Gi"),
             node_object("h100-0", gpus=8, product="NVIDIA-H100-80GB-HBM3", cpu="96", memory="1Ti")]
    pods = [_chat("on-l4", "7B"), _chat("on-l40s", "7B", "10"), _chat("on-h100", "7B", "10")]
    r = ReplayResult("x")
    r.placements = {"on-l4": "l4-0", "on-l40s": "l40s-0", "on-h100": "h100-0"}
    r.samples = [_sample({"l4-0": 2, "l40s-0": 3}), _sample({})]
    f = bench_replay.gravity_figures(nodes, pods, r)
    # The serving corpus measured a 7B 8-bit model at one request on one L40S at about 12 ms per
    # token and on one H100 at about 4.4: a 10 ms target is missed on the L40S only. No source
    # measured the L4: that pod is counted as not judged, never as on target.
    assert f["interactive_pods"] == 3
    assert f["interactive_off_target"] == 1 and 10 < f["off_target_ms_per_token"][0] < 20
    assert f["interactive_unjudged"] == 1 and f["unjudged_cases"] == ["7e+09 x1 on L4"]
    assert f["interactive_judged_how"] == {"measured": 2}
    # Two L4s ($0.805) and three L40S ($1.861) stranded in one sample, none in the other.
    assert f["mean_stranded_usd_per_hour"] == pytest.approx((2 * 0.805 + 3 * 1.861) / 2, rel=1e-3)


def test_mostalloc_sep_keeps_interactive_serving_off_training_by_anti_affinity(bench_replay: ModuleType) -> None:
    chat = _chat("chat", "7B")
    batch = ReplayPod(pod_object("batch", namespace="pipelines", stage="serving", gpus=1, uid="u-b",
                                 annotations={ANN + "latency-class": "batch"}), duration=60.0)
    sft = ReplayPod(pod_object("sft", namespace="pipelines", stage="sft", gpus=2, uid="u-s",
                               annotations={ANN + "model-params": "7B"}), arrive=5.0, duration=60.0, after=("chat",))
    plain = ReplayPod(pod_object("plain", namespace="pipelines", gpus=1, uid="u-p"))
    out = {p.name: p for p in bench_replay.variant_pods("mostalloc-sep", [chat, batch, sft, plain])}
    role = bench_replay.ROLE_LABEL
    labels = {n: p.manifest["metadata"].get("labels", {}).get(role) for n, p in out.items()}
    assert labels == {"chat": "interactive", "batch": None, "sft": "training", "plain": None}
    terms = out["chat"].manifest["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [{"labelSelector": {"matchLabels": {role: "training"}}, "topologyKey": "kubernetes.io/hostname"}]
    # Only interactive serving carries the rule (kube-scheduler applies it both ways); timing kept.
    assert all("affinity" not in out[n].manifest["spec"] for n in ("batch", "sft", "plain"))
    assert (out["sft"].arrive, out["sft"].duration, out["sft"].after) == (5.0, 60.0, ("chat",))
    # The input is not changed: the other variants get the pods as they were.
    assert "affinity" not in chat.manifest["spec"] and role not in (chat.manifest["metadata"].get("labels") or {})
    assert bench_replay.variant_pods("mostalloc", [chat])[0] is chat


def test_the_benchmarks_table_reads_a_pipeline_result_file(tmp_path: Path) -> None:
    report = importlib.import_module("bench.replay_report")
    variant = {"time_weighted": {"stranded_share": 0.00741, "whole_free_8gpu_nodes": 28.3166},
               "mean_stranded_share": 0.0088, "mean_whole_free_8gpu_nodes": 26.07,
               "mean_stranded_usd_per_hour": 3.14, "mean_mixed_nodes": 0.0, "max_mixed_nodes": 0,
               "interactive_off_target": 0, "interactive_pods": 24, "cost_total": 2791.7, "colocated": 0.538,
               "overcommits": 0, "agreement": {"top": 56.0, "tied_top": 26.0, "lower": 0.0, "unranked": 0.0}}
    baseline = {**variant, "time_weighted": None, "agreement": None}
    path = tmp_path / "replay-gravity-seed1.json"
    path.write_text(json.dumps({"gpu": {"variants": {"ours": variant, "mostalloc": baseline}}}))
    ours, base = report.rows(path)
    assert ours == ("| seed1 | gpu | ours | 0.0074 | 0.0088 | 28.32 | 26.07 | 3.14 | 0.00 / 0 | 0/24 | 2,792 | "
                    "53.8 % | 0 | 100 % (56 top, 26 tied) |")
    # A wall-clock run has no time-weighted figures; a baseline has no agreement counter.
    assert base.startswith("| seed1 | gpu | mostalloc | - | 0.0088 | - | 26.07 |") and base.endswith("| 0 | - |")
    assert report.HEADER.count("|") == ours.count("|")


def test_an_unknown_clock_is_refused_before_anything_starts(bench_replay: ModuleType) -> None:
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(bench_replay.main)
    result = CliRunner().invoke(app, ["--gravity", "gpu", "--clock", "sundial"])
    assert result.exit_code == 2
    assert "--clock must be one of wall, virtual" in result.output


@pytest.mark.parametrize("load", ["0", "-1", "nan", "inf"])
def test_a_load_that_is_not_a_positive_ratio_is_refused_before_anything_starts(
        bench_replay: ModuleType, load: str) -> None:
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(bench_replay.main)
    result = CliRunner().invoke(app, ["--llm-jobs", "10", "--load", load])
    assert result.exit_code == 2
    assert "--load must be a finite demand/capacity ratio above 0" in " ".join(result.output.split())


def test_the_llm_mix_has_the_kalos_shares_and_the_load_sets_the_span(bench_replay: ModuleType) -> None:
    nodes, pods, meta = bench_replay.llm_cluster_workload(400, 1, 1.0)
    _, _, heavy = bench_replay.llm_cluster_workload(400, 1, 2.0)
    assert len(nodes) == 16 and meta["gpus"] == 128
    jobs = meta["jobs_by_class"]
    assert sum(jobs.values()) == 400 and jobs["eval"] > jobs["sft"] > jobs["pretrain"] > 0
    # Twice the load on the same jobs: the same work arrives over half the span.
    assert heavy["span_s"] == pytest.approx(meta["span_s"] / 2)
    gangs = {p.name.rsplit("-", 1)[0] for p in pods if p.name.startswith("p")}
    assert len(gangs) == jobs["pretrain"]
    assert all(int(p.manifest["metadata"]["annotations"]["llm-placement.io/gang-size"]) >= 2
               for p in pods if p.name.startswith("p"))


def _report() -> ModuleType:
    return importlib.import_module("bench.replay_report")


def test_the_packing_bound_is_what_perfect_packing_of_the_same_work_would_strand() -> None:
    kinds = {"a1": (8, "A100"), "a2": (8, "A100"), "h1": (8, "H100"), "l1": (4, "L4")}
    # Three 1-GPU pods on each of two A100 nodes: on one node they would leave 2 free, not 10.
    assert packing_bound({"a1": 5, "a2": 5}, kinds) == 2
    # Work of different GPUs or sizes cannot be pooled: each kind keeps its own remainder.
    assert packing_bound({"a1": 7, "h1": 7, "l1": 3}, kinds) == 7 + 7 + 3
    # Partly used nodes whose work fills whole nodes exactly strand nothing when packed.
    assert packing_bound({"a1": 4, "a2": 4}, kinds) == 0
    assert packing_bound({}, kinds) == 0


def test_time_weighting_keeps_stranded_hours_per_node_and_the_excess_over_packing() -> None:
    w = _TimeWeighted({"a1": (8, "A100"), "a2": (8, "A100")})
    w.add(Sample(1, 0.0, 0.0, 6, 10, 10, 0, 0, 0, 0, 0, {"a1": 5, "a2": 5}), 3600.0)  # bound 2
    w.add(Sample(2, 0.0, 0.0, 1, 15, 7, 1, 1, 0, 0, 0, {"a1": 7}), 3600.0)  # already packed
    f = w.figures()
    assert f["stranded_gpu_hours"] == pytest.approx(17.0)
    assert f["stranded_beyond_packing_gpu_hours"] == pytest.approx(8.0)
    assert f["stranded_gpu_hours_by_node"] == {"a1": pytest.approx(12.0), "a2": pytest.approx(5.0)}
    assert f["nodes_8gpu"] == 2


def test_the_common_window_gives_a_variant_that_finished_sooner_its_empty_cluster_back() -> None:
    report = _report()
    soon = {"time_weighted": {"span_s": 1000.0, "whole_free_8gpu_nodes": 2.0, "nodes_8gpu": 4,
                              "stranded_beyond_packing_gpu_hours": 0.5}, "stranded_usd_total": 30.0}
    late = {"time_weighted": {"span_s": 3000.0, "whole_free_8gpu_nodes": 3.0, "nodes_8gpu": 4,
                              "stranded_beyond_packing_gpu_hours": 0.0}, "stranded_usd_total": 45.0}
    out = report.common_window({"soon": soon, "late": late})
    # Own spans say 2 against 3 whole free nodes; over the 3,000 s both ran, the variant that was
    # done at 1,000 s had all 4 nodes free for the last 2,000 s: (2 x 1000 + 4 x 2000) / 3000.
    assert out["soon"]["whole_free_8gpu_nodes"] == pytest.approx(10000 / 3000)
    assert out["late"]["whole_free_8gpu_nodes"] == pytest.approx(3.0)
    assert out["soon"]["stranded_usd_per_hour"] == pytest.approx(30.0 / (3000 / 3600))
    assert out["late"]["stranded_usd_per_hour"] == pytest.approx(45.0 / (3000 / 3600))
    assert out["soon"]["beyond_packing_gpu_h"] == 0.5


def test_a_bound_from_a_larger_measured_model_never_counts_as_a_miss(bench_replay: ModuleType) -> None:
    nodes = [node_object("l40s-0", gpus=4, product="NVIDIA-L40S", cpu="48", memory="192Gi")]
    # On one L40S the corpus's smallest 8-bit model at one request is a 7B at about 12 ms/token:
    # a 1B model is at most that, so a 50 ms target is met and a 5 ms target cannot be judged.
    pods = [_chat("met", "1B"), _chat("unknown", "1B", "5")]
    r = ReplayResult("x")
    r.placements = {"met": "l40s-0", "unknown": "l40s-0"}
    f = bench_replay.gravity_figures(nodes, pods, r)
    assert f["interactive_off_target"] == 0
    assert f["interactive_judged_how"] == {"bounded": 1} and f["interactive_unjudged"] == 1


def test_the_outcome_bars_are_drawn_relative_to_mostallocated(tmp_path: Path) -> None:
    report = _report()
    tw = {"span_s": 3600.0, "whole_free_8gpu_nodes": 1.0, "nodes_8gpu": 2, "stranded_beyond_packing_gpu_hours": 0}
    run = {"ours": {"spent_total": 80.0, "completion_mean_s": 50.0, "queue_p95_s": 0.0, "time_weighted": tw,
                    "stranded_usd_total": 5.0},
           "mostalloc": {"spent_total": 100.0, "completion_mean_s": 100.0, "queue_p95_s": 10.0,
                         "time_weighted": tw, "stranded_usd_total": 10.0}}
    path = tmp_path / "replay-llm-x.json"
    path.write_text(json.dumps({"load-1": {"meta": {}, "variants": run}}))
    assert report._metric(run, "ours", "stranded_usd_per_hour") == pytest.approx(5.0)
    assert report._metric(run, "kueue", "spent_total") is None
    out = report.bars([path], tmp_path / "bars.png")
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"


def test_the_dollars_floor_runs_each_pod_and_each_gang_where_its_work_costs_least(
        bench_replay: ModuleType) -> None:
    from kubeharness.runtime import PodRuntime

    nodes = [node_object("h", gpus=8, product="NVIDIA-H100-80GB-HBM3", cpu="96", memory="1Ti"),
             node_object("a", gpus=8, product="NVIDIA-A100-SXM4-80GB", cpu="96", memory="1Ti")]
    gang = {"llm-placement.io/gang-name": "g", "llm-placement.io/gang-size": "2",
            "llm-placement.io/model-params": "6.658859008B"}
    long = ReplayPod(pod_object("g-0", stage="pretraining", gpus=8, annotations=gang), duration=3600.0)
    short = ReplayPod(pod_object("g-1", stage="pretraining", gpus=8, annotations=gang), duration=600.0)
    runtime = PodRuntime(nodes)
    h = 6.88 * 8
    # Lockstep: both members run the long one's hour. On H100 that is two node-hours; on A100 the
    # hour's work takes 10,643 / 4,641 as long at half the price, which costs more.
    assert bench_replay.dollars_floor(nodes, [long, short], runtime) == pytest.approx(2 * h, rel=1e-3)
    # A batch serving pod alone takes the cheapest node for its tokens: the A100 (1.65x as long
    # as on the H100, per the serving corpus, at half the hourly price).
    serve = ReplayPod(pod_object("s", stage="serving", gpus=1, annotations={
        "llm-placement.io/latency-class": "batch", "llm-placement.io/model-params": "7B"}), duration=3600.0)
    ratio = runtime.serving.ratio("A100-SXM4-80GB")
    assert bench_replay.dollars_floor(nodes, [serve], runtime) == pytest.approx(3.43 * ratio, rel=1e-3)


def test_the_completion_floor_starts_each_stage_when_its_inputs_are_done_on_its_fastest_shape(
        bench_replay: ModuleType) -> None:
    from kubeharness.runtime import PodRuntime

    nodes = [node_object("h", gpus=8, product="NVIDIA-H100-80GB-HBM3", cpu="96", memory="1Ti"),
             node_object("a", gpus=8, product="NVIDIA-A100-SXM4-80GB", cpu="96", memory="1Ti")]
    params = {"llm-placement.io/model-params": "6.658859008B"}
    gang = {**params, "llm-placement.io/gang-name": "g", "llm-placement.io/gang-size": "2"}
    pods = [
        # Pipeline 0: two stages one after the other, arriving at 100 s; the H100 is the fastest.
        ReplayPod(pod_object("p0-a", stage="pretraining", gpus=8, annotations=params), arrive=100.0,
                  duration=3600.0),
        ReplayPod(pod_object("p0-b", stage="pretraining", gpus=8, annotations=params), arrive=100.0,
                  duration=600.0, after=("p0-a",)),
        # Pipeline 1: a gang runs in lockstep, its members the long one's hour.
        ReplayPod(pod_object("p1-g0", stage="pretraining", gpus=8, annotations=gang), duration=3600.0),
        ReplayPod(pod_object("p1-g1", stage="pretraining", gpus=8, annotations=gang), duration=600.0),
    ]
    floor = bench_replay.completion_floor(nodes, pods, PodRuntime(nodes))
    assert floor["mean_s"] == pytest.approx((4200.0 + 3600.0) / 2)
    assert floor["p95_s"] == pytest.approx(4200.0)


def test_a_pipeline_load_compresses_the_same_pipelines_arrivals(bench_replay: ModuleType) -> None:
    _nodes, base, meta = bench_replay.gravity_workload("gpu", 12, 1)
    _nodes, heavy, heavy_meta = bench_replay.gravity_workload("gpu", 12, 1, 1.0)
    _nodes, light, light_meta = bench_replay.gravity_workload("gpu", 12, 1, 0.25)
    # The same pods, models and durations; only when they arrive changes.
    assert [(p.name, p.duration) for p in heavy] == [(p.name, p.duration) for p in base]
    assert heavy_meta["load"] == pytest.approx(1.0) and light_meta["load"] == pytest.approx(0.25)
    assert heavy_meta["gpus"] == 392 and meta["mean_arrival_s"] == 1200.0
    last = {name: max(p.arrive for p in pods) for name, pods in (("heavy", heavy), ("light", light))}
    assert last["light"] == pytest.approx(4 * last["heavy"])


def test_runs_of_the_same_workload_merge_and_different_workloads_are_refused(tmp_path: Path) -> None:
    report = _report()
    meta = {"jobs": 10, "seed": 1, "load": 1.0}
    first = tmp_path / "a.json"
    first.write_text(json.dumps({"load-1": {"meta": meta, "variants": {"ours": {"x": 1}, "mostalloc": {"x": 2}}}}))
    again = tmp_path / "b.json"
    again.write_text(json.dumps({"load-1": {"meta": {**meta, "dollars_floor": 5.0},
                                            "variants": {"ours": {"x": 3}}}}))
    out = report.merge([first, again], tmp_path / "m.json")
    doc = json.loads(out.read_text())["load-1"]
    assert doc["variants"] == {"ours": {"x": 3}, "mostalloc": {"x": 2}}
    assert doc["meta"]["dollars_floor"] == 5.0 and doc["merged_from"] == ["a.json", "b.json"]
    other = tmp_path / "c.json"
    other.write_text(json.dumps({"load-1": {"meta": {**meta, "seed": 2}, "variants": {"ours": {}}}}))
    with pytest.raises(typer.BadParameter, match="seed is 2, not 1"):
        report.merge([first, other], tmp_path / "n.json")


def _run(completion: float, spent: float, queue_p95: float, span: float, stranded_usd: float,
         free_nodes: float) -> dict:
    return {"gangs": 2, "gang_deadlocks": 0, "interactive_pods": 4, "interactive_unjudged": 1,
            "interactive_off_target": 0, "completion_mean_s": completion, "spent_total": spent,
            "queue_p95_s": queue_p95, "stranded_usd_total": stranded_usd,
            "time_weighted": {"span_s": span, "whole_free_8gpu_nodes": free_nodes, "nodes_8gpu": 10}}


def test_repeated_baseline_runs_give_ranges_and_ours_is_judged_against_every_run(tmp_path: Path) -> None:
    report = _report()
    meta = {"seed": 1, "load": 1.0}
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"gpu-load-1": {"meta": meta, "variants": {
        "ours": _run(90.0, 100.0, 10.0, 3600.0, 3.0, 8.0),
        "mostalloc": _run(100.0, 110.0, 20.0, 7200.0, 20.0, 6.0)}}}))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"gpu-load-1": {"meta": meta, "variants": {
        "mostalloc": _run(120.0, 125.0, 30.0, 3600.0, 10.0, 7.0),
        "kueue": _run(110.0, 115.0, 8.0, 3600.0, 5.0, 7.0),
        # an earlier build of ours: left out by --drop
        "ours": _run(1.0, 1.0, 1.0, 3600.0, 0.0, 10.0)}}}))
    runs = report.repeated_runs([a, b], frozenset({("b.json", "ours")}))
    assert len(runs[(1, "gpu-load-1")]["ours"]) == 1 and len(runs[(1, "gpu-load-1")]["mostalloc"]) == 2
    rows = report.repeat_rows(runs)
    most = next(r for r in rows if "| mostalloc |" in r)
    assert "| 2 | 100-120 | 110-125 | 20-30 |" in most and most.endswith("| 0 / 3 | 0 |")
    # One window for every run of the workload (the longest span, 7,200 s): ours' 3 dollars of
    # stranded GPUs over 2 hours, and its cluster back empty (10 free nodes) for the second hour.
    ours = runs[(1, "gpu-load-1")]["ours"][0]["_window"]
    assert ours["stranded_usd_per_hour"] == pytest.approx(1.5)
    assert ours["whole_free_8gpu_nodes"] == pytest.approx(9.0)
    [verdict] = report.verdict_rows(runs)
    # dollars 100 against 110 and 125; completion 90 against 100 and 120; queueing p95 10 against
    # Kueue's 8.
    assert "| -20 to -9 % | -25 to -10 % | +25 % |" in verdict
    # MostAllocated's second run also finished in an hour: 7 free nodes, then 10, so 8.5.
    assert verdict.endswith("9.0 / 8.5 |")


def test_the_repeat_bars_span_every_pair_of_runs(tmp_path: Path) -> None:
    report = _report()
    variants = {"ours": [{"spent_total": 90.0}, {"spent_total": 100.0}],
                "mostalloc": [{"spent_total": 100.0}, {"spent_total": 120.0}, {"spent_total": 80.0}]}
    mid, lo, hi = report.ratio_span(variants, "ours", "mostalloc", "dollars spent")
    assert (lo, hi) == (pytest.approx(0.75), pytest.approx(1.25))
    # Six pairs: 0.75, 0.83, 0.9, 1.0, 1.125, 1.25; the median is between 0.9 and 1.0.
    assert mid == pytest.approx(0.95)
    assert all(x != x for x in report.ratio_span(variants, "kueue", "mostalloc", "dollars spent"))


def test_a_figure_that_is_zero_for_every_baseline_run_is_compared_without_dividing() -> None:
    report = _report()
    assert report._change([0.0], [0.0, 0.0]) == "both 0"
    assert report._change([5.0], [0.0]) == "-"
    assert report._change([90.0], [100.0, 120.0]) == "-25 to -10 %"


def test_repeats_take_ours_only_from_the_named_files_and_refuse_a_malformed_drop(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _report()
    meta = {"seed": 1, "load": 1.0}
    now = tmp_path / "replay-gravity-s1-ours.json"
    now.write_text(json.dumps({"gpu-load-1": {"meta": meta, "variants": {
        "ours": _run(90.0, 100.0, 10.0, 3600.0, 3.0, 8.0)}}}))
    before = tmp_path / "replay-gravity-s1-a.json"
    before.write_text(json.dumps({"gpu-load-1": {"meta": meta, "variants": {
        "ours": _run(50.0, 50.0, 5.0, 3600.0, 1.0, 9.0),
        "mostalloc": _run(100.0, 110.0, 20.0, 3600.0, 20.0, 6.0)}}}))
    report.main([now, before], repeats=True, plot=None, merge_to=None, drop=[],
                ours_from="replay-gravity-s?-ours*.json")
    ours = next(line for line in capsys.readouterr().out.splitlines() if "| ours |" in line)
    assert "| 1 | 90 | 100 |" in ours  # one run: the earlier build's ours left out
    with pytest.raises(typer.BadParameter, match="give FILE:VARIANT"):
        report.main([now], repeats=True, plot=None, merge_to=None, drop=["ours"], ours_from=None)


# Two 8-GPU nodes of model H and one of model A. A solo pod x fills h1 until x_end; gang G (2 x 8
# GPUs) exists from 10 and can only run on h1 + h2; gang L (2 x 4 GPUs), created after G at 20,
# starts at once on one node. Whether L stood in G's way depends on where it ran, how long, and
# whether G fitted when L started.
@pytest.mark.parametrize(("x_end", "l_node", "l_end", "g_start", "delayed_at", "kind"), [
    (100.0, "h2", 300.0, 300.0, 100.0, "passed over"),  # G did not fit at 20; L held h2 past 100
    (100.0, "h2", 90.0, 100.0, None, "backfill"),  # ended before G could have started
    (100.0, "a1", 300.0, 100.0, None, "backfill"),  # on the one A node, which G cannot use
    (15.0, "h2", 300.0, 300.0, 20.0, "overtook"),  # G fitted on h1 + h2 when L took h2
])
def test_a_later_gang_that_started_first_is_a_backfill_only_if_it_never_stood_in_the_way(
        x_end: float, l_node: str, l_end: float, g_start: float, delayed_at: float | None, kind: str) -> None:
    report = _report()
    nodes = {"h1": ("H", 8), "h2": ("H", 8), "a1": ("A", 8)}
    gangs = {"ns/g": ["g-0", "g-1"], "ns/l": ["l-0", "l-1"]}
    gpus = {"x": 8, "g-0": 8, "g-1": 8, "l-0": 4, "l-1": 4}
    placements = {"x": "h1", "g-0": "h1", "g-1": "h2", "l-0": l_node, "l-1": l_node}
    created = {"x": 0.0, "g-0": 10.0, "g-1": 10.0, "l-0": 20.0, "l-1": 20.0}
    started = {"x": 0.0, "g-0": g_start, "g-1": g_start, "l-0": 20.0, "l-1": 20.0}
    ran = {"x": x_end, "g-0": 50.0, "g-1": 50.0, "l-0": l_end - 20.0, "l-1": l_end - 20.0}
    out = report.overtakes(gangs, gpus, nodes, placements, created, started, ran)
    (o,) = out["ns/g"]
    assert (o.later, o.later_start, o.later_end) == ("ns/l", 20.0, l_end)
    assert (o.delayed_at, o.kind) == (delayed_at, kind)
    assert out["ns/l"] == []  # an earlier gang that started first overtook nothing


def test_a_gang_started_before_a_later_one_is_not_overtaken() -> None:
    report = _report()
    out = report.overtakes({"ns/g": ["g-0", "g-1"], "ns/l": ["l-0", "l-1"]},
                           {"g-0": 8, "g-1": 8, "l-0": 8, "l-1": 8},
                           {"h1": ("H", 8), "h2": ("H", 8)},
                           {"g-0": "h1", "g-1": "h2", "l-0": "h1", "l-1": "h2"},
                           {"g-0": 0.0, "g-1": 0.0, "l-0": 5.0, "l-1": 5.0},
                           {"g-0": 0.0, "g-1": 0.0, "l-0": 50.0, "l-1": 50.0},
                           {"g-0": 50.0, "g-1": 50.0, "l-0": 10.0, "l-1": 10.0})
    assert out == {"ns/g": [], "ns/l": []}


def test_waiting_behind_later_work_counts_many_small_pods_that_together_fill_a_gangs_nodes() -> None:
    report = _report()
    # G (2 x 8 GPUs, created at 10) on two 8-GPU nodes. An earlier pod e holds 7 GPUs of h1 until
    # 50; two later 1-GPU pods, a on h1 and b on h2, hold one GPU each from 20 to 130. Neither alone
    # is in G's way (the other still blocks a node); together they are, from e's end at 50 until G
    # starts at 130: 80 s. Before 50, e (earlier than G) kept G out, which is queue order.
    gangs = {"ns/g": ["g-0", "g-1"]}
    gpus = {"e": 7, "a": 1, "b": 1, "g-0": 8, "g-1": 8}
    nodes = {"h1": ("H", 8), "h2": ("H", 8)}
    placements = {"e": "h1", "a": "h1", "b": "h2", "g-0": "h1", "g-1": "h2"}
    created = {"e": 0.0, "g-0": 10.0, "g-1": 10.0, "a": 20.0, "b": 20.0}
    started = {"e": 0.0, "a": 20.0, "b": 20.0, "g-0": 130.0, "g-1": 130.0}
    ran = {"e": 50.0, "a": 110.0, "b": 110.0, "g-0": 10.0, "g-1": 10.0}
    args = (gangs, gpus, nodes, placements, created, started, ran)
    assert report.behind_later_work(*args) == {"ns/g": pytest.approx(80.0)}
    assert report.overtakes(*args) == {"ns/g": []}  # no later gang: none overtook it
    created.update({"a": 5.0, "b": 5.0})  # the same pods created before G: queue order, not counted
    assert report.behind_later_work(*args) == {"ns/g": 0.0}


def _llm_run(completion: float, span: float, stranded_usd: float, free_nodes: float) -> dict:
    return {"gangs_started": 2, "gang_deadlocks": 0, "idle_held_gpu_h": 0.0, "queue_p50_s": 0.0,
            "queue_p95_s": 10.0, "completion_mean_s": completion, "completion_p95_s": completion,
            "spent_total": 100.0, "stranded_usd_total": stranded_usd, "mixed_gpu_gangs": 0,
            "time_weighted": {"span_s": span, "whole_free_8gpu_nodes": free_nodes, "nodes_8gpu": 10,
                              "stranded_gpu_hours": 1.0, "stranded_beyond_packing_gpu_hours": 0.0}}


def test_the_llm_table_groups_runs_of_one_workload_across_files_and_names_each_file(tmp_path: Path) -> None:
    report = _report()
    meta = {"jobs": 10, "seed": 1, "load": 1.0, "dollars_floor": 50.0}
    kueue = tmp_path / "replay-llm-k.json"
    kueue.write_text(json.dumps({"load-1": {"meta": meta, "variants": {
        "kueue-tas": _llm_run(120.0, 7200.0, 20.0, 6.0), "kueue": _llm_run(130.0, 3600.0, 10.0, 6.0)}}}))
    ours = tmp_path / "replay-llm-ours.json"
    ours.write_text(json.dumps({"load-1": {"meta": meta, "variants": {"ours": _llm_run(90.0, 3600.0, 3.0, 8.0)}},
                                "load-0.5": {"meta": {**meta, "load": 0.5},
                                             "variants": {"ours": _llm_run(80.0, 3600.0, 3.0, 8.0)}}}))
    rows = report.llm_rows([kueue, ours])
    # Sorted by load, then ours, mostalloc, kueue, kueue-tas, whichever file each run came from.
    assert [[c.strip() for c in r.split("|")[1:5]] for r in rows] == [
        ["1", "0.5", "ours", "replay-llm-ours.json"], ["1", "1", "ours", "replay-llm-ours.json"],
        ["1", "1", "kueue", "replay-llm-k.json"], ["1", "1", "kueue-tas", "replay-llm-k.json"]]
    # One common window for the load-1 runs of both files (Kueue-TAS's 7,200 s): ours' 3 dollars
    # of stranded GPUs over 2 hours, its 10 nodes back and free for the second hour.
    assert "| 100 (floor +100 %) | 1.5 | 1.0 / 0.0 | 8.00 / 9.00 | 0 |" in rows[1]
    assert "| 8.00 / 8.00 |" in rows[0]  # load 0.5 is its own workload: ours alone, own window
    other = tmp_path / "replay-llm-other.json"
    other.write_text(json.dumps({"load-1": {"meta": {**meta, "jobs": 20}, "variants": {}}}))
    with pytest.raises(typer.BadParameter, match="jobs is 20, not 10"):
        report.llm_rows([kueue, other])
