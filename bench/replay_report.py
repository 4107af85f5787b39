"""Markdown rows for BENCHMARKS.md from replay results (bench/replay.py --gravity / --llm-jobs).

    python bench/replay_report.py bench/results/replay-gravity-seed1.json ...-seed2.json ...
    python bench/replay_report.py --llm bench/results/replay-llm-seed1.json ...
    python bench/replay_report.py --llm --plot bench/results/replay-llm-bars.png <files>
    python bench/replay_report.py --repeats <files> [--drop FILE:VARIANT ...]

One row per (file, mix, variant): time-weighted and sampled stranded share, whole free 8-GPU nodes,
list price of the stranded GPUs, training beside interactive serving, interactive serving off its
ms/token target, cost, co-location, agreement. A file's name after ``replay-gravity-`` labels its rows.
"""

from __future__ import annotations

import bisect
import fnmatch
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import typer


def _agreement(v: dict) -> str:
    a = v.get("agreement")
    if not a:
        return "-"
    total = sum(a.values())
    share = (a.get("top", 0) + a.get("tied_top", 0)) / total if total else 0.0
    return f"{100 * share:.0f} % ({a.get('top', 0):.0f} top, {a.get('tied_top', 0):.0f} tied)"


def attainment(v: dict) -> str:
    """Interactive serving off its per-token target, judged by measurement, out of those judged."""
    judged = v["interactive_pods"] - v.get("interactive_unjudged", 0)
    unjudged = v.get("interactive_unjudged")
    return f"{v['interactive_off_target']}/{judged}" + (f" ({unjudged} not judged)" if unjudged else "")


def rows(path: Path) -> list[str]:
    label = path.stem.removeprefix("replay-gravity-").removeprefix("replay-gravity")
    out = []
    for mix, doc in json.loads(path.read_text()).items():
        for variant, v in doc["variants"].items():
            tw = v.get("time_weighted") or {}
            out.append(" | ".join([
                "", label or "-", mix, variant,
                f"{tw['stranded_share']:.4f}" if tw else "-",
                f"{v['mean_stranded_share']:.4f}",
                f"{tw['whole_free_8gpu_nodes']:.2f}" if tw else "-",
                f"{v['mean_whole_free_8gpu_nodes']:.2f}",
                f"{v['mean_stranded_usd_per_hour']:.2f}",
                f"{v['mean_mixed_nodes']:.2f} / {v['max_mixed_nodes']}",
                attainment(v),
                f"{v['cost_total']:,.0f}",
                f"{100 * v['colocated']:.1f} %",
                str(v["overcommits"]),
                _agreement(v), "",
            ]).strip())
    return out


HEADER = ("| run | mix | variant | stranded / free GPUs, time-weighted | same, sampled at arrivals | "
          "whole free 8-GPU nodes, time-weighted | same, sampled | list price of the stranded GPUs, $/h | "
          "training beside interactive serving (nodes, mean / max) | "
          "interactive serving off its target (measured) | "
          "est. cost $ | co-located, all edges | over-commits | agreement (top or tied) |")


OUTCOME_HEADER = ("| run | mix | variant | gangs run whole / deadlocks | queueing p50 / p95, s | "
                  "pipelines done | completion mean / p95, s | dollars spent | interactive serving off "
                  "target (measured) | stranded $/h, common window | stranded GPU-h beyond perfect packing | "
                  "whole free 8-GPU nodes, common window | GB read off-node / input read h | "
                  "co-located edges |")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _spent(v: dict, meta: dict) -> str:
    """Dollars spent, and how far above the fewest any placement could spend (bench/replay.py
    ``dollars_floor``) when the run recorded it."""
    spent, floor = v.get("spent_total", 0.0), meta.get("dollars_floor")
    return f"{spent:,.0f}" + (f" (floor +{100 * (spent / floor - 1):.0f} %)" if floor else "")


def outcome_rows(path: Path) -> list[str]:
    """Virtual-clock outcomes per mix and variant: what the work cost, how long it waited and
    took, whether serving met its measured target, what stranded, what data moved."""
    label = path.stem.removeprefix("replay-gravity-").removeprefix("replay-gravity")
    out = []
    for mix, doc in json.loads(path.read_text()).items():
        common = common_window(doc["variants"])
        for variant, v in doc["variants"].items():
            if "gangs" not in v:
                continue
            cw = common[variant]
            moved = v.get("moved_gb_by_tier") or {}
            off_node = sum(gb for tier, gb in moved.items() if tier != "same-node")
            out.append(" | ".join([
                "", label or "-", mix, variant, f"{v['gangs_started']} / {v['gang_deadlocks']}",
                f"{_s(v['queue_p50_s'])} / {_s(v['queue_p95_s'])}",
                f"{v['pipelines_done']} / {v['pipelines']}",
                f"{_s(v.get('completion_mean_s'))} / {_s(v['completion_p95_s'])}",
                _spent(v, doc.get("meta") or {}), attainment(v),
                f"{cw['stranded_usd_per_hour']:.1f}", f"{cw['beyond_packing_gpu_h']:.1f}",
                f"{cw['whole_free_8gpu_nodes']:.2f}",
                f"{off_node:,.0f} / {v.get('input_read_s', 0.0) / 3600:.2f}",
                f"{100 * v['colocated']:.1f} %", "",
            ]).strip())
    return out


LLM_HEADER = ("| seed | load | variant | result file | gangs run / deadlocks | GPU-h held idle | "
              "queueing p50 / p95, s | job completion mean / p95, s | dollars spent | stranded $/h, common "
              "window | stranded GPU-h / beyond perfect packing | whole free 8-GPU nodes, own span / common "
              "window | gangs started across GPU models |")
LLM_ORDER = ("ours", "mostalloc", "kueue", "kueue-tas")


def common_window(variants: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Stranded $/h and whole free 8-GPU nodes per variant over one window: the longest trace span
    of the run. Each variant's own time average rewards finishing late (a long tail with a few jobs
    left counts many free nodes); over a common window a variant that finished its work sooner has
    its cluster back, empty, for the rest of it. Nothing is stranded on an empty cluster."""
    spans = {v: _span(x) for v, x in variants.items()}
    window = max(spans.values(), default=0.0) or 1.0
    return {v: windowed(x, window) for v, x in variants.items()}


def _span(x: dict) -> float:
    return float((x.get("time_weighted") or {}).get("span_s", 0.0))


def windowed(x: dict, window: float) -> dict[str, float]:
    """One run's stranded $/h and whole free 8-GPU nodes over ``window`` seconds (>= its span)."""
    tw = x.get("time_weighted") or {}
    span = _span(x)
    whole = tw.get("whole_free_8gpu_nodes", 0.0) * span + tw.get("nodes_8gpu", 0) * (window - span)
    return {"window_s": window, "whole_free_8gpu_nodes": whole / window,
            "stranded_usd_per_hour": x.get("stranded_usd_total", 0.0) / (window / 3600.0),
            "beyond_packing_gpu_h": tw.get("stranded_beyond_packing_gpu_hours", float("nan"))}


def _same_workload(name: str, key: str, have: dict, meta: dict) -> None:
    for k in WORKLOAD_KEYS:
        if k in have and k in meta and have[k] != meta[k]:
            raise typer.BadParameter(f"{name} {key}: {k} is {meta[k]!r}, not {have[k]!r}")


def llm_rows(files: list[Path]) -> list[str]:
    """The LLM-cluster mix (bench/replay.py --llm-jobs): one row per run of a variant, naming the file
    it came from. Runs of one workload (seed and load) from several files (baselines once, ours
    again, a baseline repeated) are one group: sorted together and judged over one common window,
    the longest span among them. Refuses runs of one seed and load whose workloads differ."""
    runs: dict[tuple[int, float], list[tuple[str, str, dict, dict]]] = defaultdict(list)
    first: dict[tuple[int, float], dict] = {}
    for f in files:
        for key, doc in json.loads(f.read_text()).items():
            meta = doc["meta"]
            group = (int(meta["seed"]), float(meta["load"]))
            _same_workload(f.name, key, first.setdefault(group, meta), meta)
            runs[group] += [(variant, f.name, v, meta) for variant, v in doc["variants"].items()]
    out = []
    for group in sorted(runs):
        window = max((_span(v) for _, _, v, _ in runs[group]), default=0.0) or 1.0
        order = sorted(runs[group], key=lambda r: (LLM_ORDER.index(r[0]) if r[0] in LLM_ORDER
                                                   else len(LLM_ORDER), r[0], r[1]))
        for variant, name, v, meta in order:
            tw, cw = v.get("time_weighted") or {}, windowed(v, window)
            out.append(" | ".join([
                "", str(group[0]), f"{group[1]:g}", variant, name,
                f"{v['gangs_started']} / {v['gang_deadlocks']}", f"{v['idle_held_gpu_h']:.1f}",
                f"{_s(v['queue_p50_s'])} / {_s(v['queue_p95_s'])}",
                f"{_s(v['completion_mean_s'])} / {_s(v['completion_p95_s'])}",
                _spent(v, meta), f"{cw['stranded_usd_per_hour']:.1f}",
                f"{tw.get('stranded_gpu_hours', 0.0):.1f} / {cw['beyond_packing_gpu_h']:.1f}",
                f"{tw.get('whole_free_8gpu_nodes', 0.0):.2f} / {cw['whole_free_8gpu_nodes']:.2f}",
                str(v["mixed_gpu_gangs"]), "",
            ]).strip())
    return out


class Overtake(NamedTuple):
    """A gang (``later``) created after ``gang`` that started before it. ``delayed_at`` is the first
    trace time at which ``gang``, waiting, would have fit on free GPUs of one model had ``later``'s
    pods not held theirs (None: ``later`` never stood in its way)."""

    gang: str
    later: str
    later_start: float
    later_end: float
    delayed_at: float | None

    @property
    def kind(self) -> str:
        """``backfill``: never in the earlier gang's way (beside it, or ended before it could have
        started); ``overtook``: took capacity the earlier gang, waiting, fitted in at the moment it
        started (what the gang queue forbids); ``passed over``: started when the earlier gang did not
        fit, then held capacity it could have used (BestEffortFIFO without run times, docs/gangs.md)."""
        if self.delayed_at is None:
            return "backfill"
        return "overtook" if self.delayed_at <= self.later_start else "passed over"


class _Usage:
    """GPUs in use per node at every start or end of a pod (a gang member starts with its gang)."""

    def __init__(self, gpus: dict[str, int], nodes: dict[str, tuple[str, int]], placements: dict[str, str],
                 started: dict[str, float], ran: dict[str, float]) -> None:
        self.gpus, self.nodes, self.placements, self.started = gpus, nodes, placements, started
        self.end = {p: started[p] + ran.get(p, 0.0) for p in started}
        self.events = sorted({t for p in started for t in (started[p], self.end[p])})
        self.used: list[dict[str, int]] = []
        for t in self.events:
            used: dict[str, int] = defaultdict(int)
            for p in self.running(t, started):
                used[placements[p]] += gpus.get(p, 0)
            self.used.append(used)

    def running(self, t: float, pods: Iterable[str]) -> list[str]:
        return [p for p in pods if p in self.placements and p in self.started
                and self.started[p] <= t < self.end[p]]

    def since(self, t: float) -> int:
        """Index of the state in force at ``t``: the last event at or before it."""
        return max(0, bisect.bisect_right(self.events, t) - 1)

    def fits(self, need: list[int], i: int, t: float, without: Iterable[str] = ()) -> bool:
        """``need`` fits the free GPUs of nodes of one model at ``t`` (state ``i``), ``without``'s
        running pods gone."""
        from kubeharness.replay import first_fit

        used = dict(self.used[i])
        for p in self.running(t, without):
            used[self.placements[p]] -= self.gpus.get(p, 0)
        free: dict[str, list[int]] = defaultdict(list)
        for node, (model, cap) in self.nodes.items():
            free[model].append(cap - used.get(node, 0))
        return any(first_fit(need, f) for f in free.values())


def overtakes(gangs: dict[str, list[str]], gpus: dict[str, int], nodes: dict[str, tuple[str, int]],
              placements: dict[str, str], created: dict[str, float], started: dict[str, float],
              ran: dict[str, float]) -> dict[str, list[Overtake]]:
    """For each gang, the gangs created after it that started before it, and whether each stood in
    its way.

    Queue order is the creation of a gang's first member (docs/gangs.md). A later gang H that started
    before gang G stood in G's way if, at some trace time while G waited (from when all of G existed
    and H had started until G started or H ended), G would have fit on the free GPUs of nodes of one
    model with H's pods gone but did not fit with them (``Overtake.kind`` tells whether that was
    already so when H started). Otherwise H was a backfill: it ran on capacity G could not use, or
    ended before G could have started.
    ``nodes`` maps a node to (GPU model, GPUs); ``gpus``, ``placements``, ``created``, ``started``
    and ``ran`` are per pod (a gang member's start is its gang's)."""
    inf = float("inf")
    use = _Usage(gpus, nodes, placements, started, ran)
    first = {g: min(created[m] for m in ms) for g, ms in gangs.items() if all(m in created for m in ms)}
    ready = {g: max(created[m] for m in ms) for g, ms in gangs.items() if g in first}
    start = {g: min(started[m] for m in ms) if all(m in started for m in ms) else inf
             for g, ms in gangs.items() if g in first}
    out: dict[str, list[Overtake]] = {}
    for g in sorted(first, key=lambda k: (first[k], k)):
        need = [gpus.get(m, 0) for m in gangs[g]]
        rows = []
        for h in first:
            if h == g or (first[h], h) <= (first[g], g) or start[h] >= start[g]:
                continue
            h_end = max(use.end[m] for m in gangs[h])
            lo, hi = max(ready[g], start[h]), min(start[g], h_end)
            delayed = None
            for i in range(use.since(lo), len(use.events)):
                t = max(lo, use.events[i])
                if t >= hi:
                    break
                if not use.fits(need, i, t) and use.fits(need, i, t, gangs[h]):
                    delayed = t
                    break
            rows.append(Overtake(g, h, start[h], h_end, delayed))
        out[g] = rows
    return out


def behind_later_work(gangs: dict[str, list[str]], gpus: dict[str, int], nodes: dict[str, tuple[str, int]],
                      placements: dict[str, str], created: dict[str, float], started: dict[str, float],
                      ran: dict[str, float]) -> dict[str, float]:
    """Per gang, the trace seconds it waited while work created after it (any pod, gang or not) held
    GPUs it needed: it did not fit, and would have on free GPUs of one model with every later pod
    then running gone. Pairwise overtakes miss this: many later 1-GPU pods together fill the nodes a
    gang waits for, none alone in its way."""
    use = _Usage(gpus, nodes, placements, started, ran)
    out: dict[str, float] = {}
    for g, ms in gangs.items():
        if not all(m in created for m in ms):
            continue
        first, ready = min(created[m] for m in ms), max(created[m] for m in ms)
        start = min(started[m] for m in ms) if all(m in started for m in ms) else use.events[-1]
        later = [p for p in started if created.get(p, -1.0) > first and p not in ms]
        need = [gpus.get(m, 0) for m in ms]
        total = 0.0
        for i in range(use.since(ready), len(use.events)):
            t = max(ready, use.events[i])
            if t >= start:
                break
            nxt = min(start, use.events[i + 1]) if i + 1 < len(use.events) else start
            if not use.fits(need, i, t) and use.fits(need, i, t, later):
                total += nxt - t
        out[g] = total
    return out


def _workload(meta: dict) -> tuple[list[dict], list]:
    """The nodes and pods of a run, regenerated from its meta (bench/replay.py's generators are seeded)."""
    from bench.replay import gang_workload, llm_cluster_workload

    if "jobs" in meta:
        nodes, pods, _ = llm_cluster_workload(int(meta["jobs"]), int(meta["seed"]), float(meta["load"]))
    elif "gangs" in meta:
        nodes, pods, _ = gang_workload(int(meta["gangs"]), int(meta["seed"]))
    else:
        raise typer.BadParameter("--overtaken reads LLM-cluster (--llm-jobs) and --gangs results only")
    return nodes, pods


GPU = "nvidia.com/gpu"


def overtake_tables(path: Path) -> tuple[list[str], list[str]]:
    """Per run and variant, and per gang: the later gangs that started before it and whether each was
    a backfill. Needs the per-pod starts a run records (``started_s_by_pod``)."""
    from kubeharness.replay import node_product, pod_gang, pod_gpus

    summary, per_gang = [], []
    for doc in json.loads(path.read_text()).values():
        meta = doc["meta"]
        nodes, pods = _workload(meta)
        caps = {n["metadata"]["name"]: (node_product(n), int(n["status"]["allocatable"].get(GPU, 0)))
                for n in nodes}
        gpus = {p.name: pod_gpus(p.manifest) for p in pods}
        gangs: dict[str, list[str]] = defaultdict(list)
        for p in pods:
            g = pod_gang(p.manifest)
            if g is not None:
                gangs[g[0]].append(p.name)
        for variant, v in doc["variants"].items():
            started = v.get("started_s_by_pod")
            if started is None:
                continue
            created = {p: started[p] - q for p, q in v["queue_s_by_pod"].items() if p in started}
            args = (dict(gangs), gpus, caps, v["placements"], created, started, v["ran_s_by_pod"])
            table, behind = overtakes(*args), behind_later_work(*args)
            taken = [o for os_ in table.values() for o in os_]
            kinds = {k: sum(1 for o in taken if o.kind == k) for k in ("backfill", "passed over", "overtook")}
            summary.append(" | ".join([
                "", str(meta.get("seed", "-")), f"{meta.get('load', 1.0):g}", variant, str(len(table)),
                str(sum(1 for os_ in table.values() if os_)), str(len(taken)), str(kinds["backfill"]),
                str(kinds["passed over"]), f"**{kinds['overtook']}**" if kinds["overtook"] else "0",
                f"{sum(1 for x in behind.values() if x > 0)} / {_s(sum(behind.values()))}", ""]).strip())
            waits = v.get("gang_waits") or {}
            for g, os_ in table.items():
                ms = gangs[g]
                first = min(created[m] for m in ms)
                start = min(started[m] for m in ms) if all(m in started for m in ms) else None
                by = ", ".join(f"{o.later.split('/')[-1]} ({o.kind}"
                               + ("" if o.delayed_at is None else f", in its way from {o.delayed_at:,.0f} s")
                               + ")" for o in os_) or "-"
                per_gang.append(" | ".join([
                    "", str(meta.get("seed", "-")), f"{meta.get('load', 1.0):g}", variant, g.split("/")[-1],
                    f"{len(ms)} x {gpus[ms[0]]}", _s(first), _s((waits.get(g) or {}).get("could_start")),
                    _s(start), _s(start - first) if start is not None else "-", by, _s(behind.get(g)),
                    ""]).strip())
    return summary, per_gang


OVERTAKE_HEADER = ("| seed | load | variant | gangs | gangs overtaken by a later gang | later gangs started "
                   "first | backfill | passed over (the earlier did not fit then; in its way later) | "
                   "overtook an earlier gang that fitted | gangs that waited behind later work / seconds |")
PER_GANG_HEADER = ("| seed | load | variant | gang | members x GPUs | created, s | first free whole "
                   "nodes of one model, s | started, s | waited, s | later gangs that started first | "
                   "waited behind later work, s |")


BAR_METRICS = (  # (figure, title); each relative to MostAllocated in its own run
    ("spent_total", "dollars spent"),
    ("completion_mean_s", "mean job / pipeline completion"),
    ("queue_p95_s", "queueing delay p95"),
    ("stranded_usd_per_hour", "stranded $/h (common window)"),
)


def bars(files: list[Path], out: Path, baseline: str = "mostalloc") -> Path:
    """Ours against the baselines, run by run: each outcome as a ratio to ``baseline``'s in the
    same run (below 1: better than it), one group of bars per run (file, mix or load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: list[tuple[str, dict[str, dict]]] = []
    for f in files:
        for key, doc in json.loads(f.read_text()).items():
            label = f.stem.removeprefix("replay-").removeprefix("gravity-").removeprefix("llm-")
            runs.append((f"{label} {key}", doc["variants"]))
    variants = sorted({v for _, vs in runs for v in vs if v != baseline}, key=lambda v: (v != "ours", v))
    fig, axes = plt.subplots(len(BAR_METRICS), 1, figsize=(max(8, 1.2 * len(runs)), 3 * len(BAR_METRICS)),
                             squeeze=False)
    width = 0.8 / max(1, len(variants))
    for ax, (metric, title) in zip(axes[:, 0], BAR_METRICS, strict=True):
        for i, v in enumerate(variants):
            ys = []
            for _, vs in runs:
                base, this = _metric(vs, baseline, metric), _metric(vs, v, metric)
                ys.append(this / base if base and this is not None else float("nan"))
            ax.bar([k + i * width for k in range(len(runs))], ys, width, label=v)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{title}, relative to {baseline} (below 1 is better)")
        ax.set_xticks([k + width * (len(variants) - 1) / 2 for k in range(len(runs))])
        ax.set_xticklabels([r for r, _ in runs], rotation=30, ha="right", fontsize=8)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _metric(variants: dict[str, dict], variant: str, metric: str) -> float | None:
    v = variants.get(variant)
    if v is None:
        return None
    if metric == "stranded_usd_per_hour":
        return common_window(variants)[variant][metric]
    x = v.get(metric)
    return float(x) if x is not None else None


def repeated_runs(files: list[Path], drop: frozenset[tuple[str, str]] = frozenset()
                  ) -> dict[tuple[int, str], dict[str, list[dict]]]:
    """Every run of every variant per workload (seed, mix), across files: kube-scheduler breaks ties
    at random, so one run of a baseline is one draw. ``drop`` names (file name, variant) runs to
    leave out (a variant measured before a change of ours). Each run gets its stranded $/h and
    whole free nodes over the workload's common window: the longest span of any of its runs."""
    runs: dict[tuple[int, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for f in files:
        for key, doc in json.loads(f.read_text()).items():
            for variant, v in doc["variants"].items():
                if "gangs" in v and (f.name, variant) not in drop:
                    runs[(int(doc["meta"]["seed"]), key)][variant].append(v)
    for variants in runs.values():
        window = max((_span(x) for xs in variants.values() for x in xs), default=0.0) or 1.0
        for xs in variants.values():
            for x in xs:
                x["_window"] = windowed(x, window)
    return runs


REPEAT_FIGURES = (  # (column, how to read one run, lower is better)
    ("completion mean, s", lambda x: x["completion_mean_s"], True),
    ("dollars spent", lambda x: x["spent_total"], True),
    ("queueing p95, s", lambda x: x["queue_p95_s"], True),
    ("stranded $/h, common window", lambda x: x["_window"]["stranded_usd_per_hour"], True),
    ("whole free 8-GPU nodes, common window", lambda x: x["_window"]["whole_free_8gpu_nodes"], False),
)
REPEAT_HEADER = ("| seed | mix | variant | runs | " + " | ".join(c for c, _, _ in REPEAT_FIGURES)
                 + " | interactive serving off target / judged (measured) | gang deadlocks |")


def _range(values: list[float], digits: int = 0) -> str:
    lo, hi = min(values), max(values)
    fmt = f"{{:,.{digits}f}}"
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def repeat_rows(runs: dict[tuple[int, str], dict[str, list[dict]]]) -> list[str]:
    """One row per workload and variant: the range of each outcome over its runs."""
    out = []
    for (seed, mix), variants in sorted(runs.items()):
        if "ours" not in variants:
            continue
        for variant in sorted(variants, key=lambda v: (v != "ours", v)):
            xs = variants[variant]
            cells = [_range([get(x) for x in xs], 1 if "$/h" in col or "nodes" in col else 0)
                     for col, get, _ in REPEAT_FIGURES]
            judged = [x["interactive_pods"] - x.get("interactive_unjudged", 0) for x in xs]
            off = [x["interactive_off_target"] for x in xs]
            out.append(" | ".join(["", str(seed), mix, variant, str(len(xs)), *cells,
                                   f"{_range(off)} / {_range(judged)}",
                                   str(max(x["gang_deadlocks"] for x in xs)), ""]).strip())
    return out


def _change(ours: list[float], base: list[float]) -> str:
    """Ours against each run of a baseline, as the range of ours / baseline - 1 over all pairs."""
    ratios = [100 * (o / b - 1) for o in ours for b in base if b]
    if not ratios:  # the baseline's figure is 0 in every run (nothing queued at light load)
        return "both 0" if not any(ours) else "-"
    lo, hi = min(ratios), max(ratios)
    return f"{lo:+.0f} %" if round(lo) == round(hi) else f"{lo:+.0f} to {hi:+.0f} %"


def _pick(runs: list[dict], column: str) -> list[float]:
    get = next(g for c, g, _ in REPEAT_FIGURES if c == column)
    return [float(get(x)) for x in runs]


VERDICT_HEADER = ("| seed | mix | MostAllocated runs | dollars vs MostAllocated | completion mean vs "
                  "MostAllocated | queueing p95 vs Kueue | stranded $/h vs MostAllocated | whole free "
                  "nodes: ours' fewest / MostAllocated's most |")


def verdict_rows(runs: dict[tuple[int, str], dict[str, list[dict]]]) -> list[str]:
    """Ours against every run of the baselines, per workload, in the terms of the outcome bars."""
    out = []
    for (seed, mix), variants in sorted(runs.items()):
        ours, most, kueue = variants.get("ours"), variants.get("mostalloc"), variants.get("kueue")
        if not ours or not most:
            continue
        out.append(" | ".join([
            "", str(seed), mix, str(len(most)),
            _change(_pick(ours, "dollars spent"), _pick(most, "dollars spent")),
            _change(_pick(ours, "completion mean, s"), _pick(most, "completion mean, s")),
            _change(_pick(ours, "queueing p95, s"), _pick(kueue, "queueing p95, s")) if kueue else "-",
            _change(_pick(ours, "stranded $/h, common window"), _pick(most, "stranded $/h, common window")),
            f"{min(_pick(ours, 'whole free 8-GPU nodes, common window')):.1f} / "
            f"{max(_pick(most, 'whole free 8-GPU nodes, common window')):.1f}", "",
        ]).strip())
    return out


# Meta fields that say which workload a run replayed: runs merged into one file must agree on them.
WORKLOAD_KEYS = ("jobs", "seed", "load", "scenario", "pipelines", "gangs", "nodes", "gpus", "span_s",
                 "mean_arrival_s", "dollars_floor")


def merge(files: list[Path], out: Path) -> Path:
    """One result file from runs of the same workloads in separate invocations (baselines once,
    ours again after a change): per workload key, the variants of every file, a later file's
    replacing an earlier one's. Refuses runs whose workloads differ."""
    merged: dict[str, dict] = {}
    for f in files:
        for key, doc in json.loads(f.read_text()).items():
            if key not in merged:
                merged[key] = {"meta": doc["meta"], "variants": dict(doc["variants"]),
                               "merged_from": [f.name]}
                continue
            have = merged[key]["meta"]
            _same_workload(f.name, key, have, doc["meta"])
            merged[key]["meta"] = {**doc["meta"], **have}
            merged[key]["variants"].update(doc["variants"])
            merged[key]["merged_from"].append(f.name)
    out.write_text(json.dumps(merged, indent=2))
    return out


def ratio_span(variants: dict[str, list[dict]], variant: str, baseline: str, column: str
               ) -> tuple[float, float, float]:
    """(median, least, greatest) of ``variant`` / ``baseline`` over every pair of their runs."""
    pairs = [a / b for a in _pick(variants.get(variant, []), column)
             for b in _pick(variants.get(baseline, []), column) if b]
    if not pairs:
        return float("nan"), float("nan"), float("nan")
    return float(np.median(pairs)), min(pairs), max(pairs)


def repeat_bars(runs: dict[tuple[int, str], dict[str, list[dict]]], out: Path,
                baseline: str = "mostalloc") -> Path:
    """Each variant against every run of ``baseline``, per workload: a bar at the median of the
    ratios over all pairs of runs, whiskers at their least and greatest (below 1 is better)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [k for k in sorted(runs) if "ours" in runs[k] and baseline in runs[k]]
    variants = sorted({v for k in workloads for v in runs[k] if v != baseline},
                      key=lambda v: (v != "ours", v))
    columns = [c for c, _, lower in REPEAT_FIGURES if lower]
    fig, axes = plt.subplots(len(columns), 1, figsize=(max(8, 1.3 * len(workloads)), 3 * len(columns)),
                             squeeze=False)
    width = 0.8 / max(1, len(variants))
    for ax, column in zip(axes[:, 0], columns, strict=True):
        for i, v in enumerate(variants):
            spans = [ratio_span(runs[k], v, baseline, column) for k in workloads]
            mid = [m for m, _, _ in spans]
            lo = np.nan_to_num([m - a for m, a, _ in spans]).tolist()  # no whisker where no runs
            hi = np.nan_to_num([b - m for m, _, b in spans]).tolist()
            ax.bar([j + i * width for j in range(len(workloads))], mid, width, yerr=[lo, hi],
                   capsize=3, label=v)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{column}, relative to each {baseline} run (below 1 is better)")
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(workloads))])
        ax.set_xticklabels([f"seed {s} {m}" for s, m in workloads], rotation=30, ha="right", fontsize=8)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(files: list[Path], outcomes: bool = False, llm: bool = False,
         plot: Path | None = typer.Option(None, help="also draw ours-vs-baseline bars to this PNG"),
         merge_to: Path | None = typer.Option(None, "--merge", help="merge the files' runs into this file"),
         repeats: bool = typer.Option(False, help="ranges over repeated runs of each workload, and ours "
                                                  "against every baseline run"),
         drop: list[str] = typer.Option([], help="with --repeats: FILE:VARIANT runs to leave out"),
         ours_from: str | None = typer.Option(None, help="with --repeats: take ours only from files "
                                                         "whose name matches this pattern"),
         overtaken: bool = False,
         ) -> None:
    """--overtaken: per gang, the later gangs that started before it and whether each was a backfill
    (LLM-cluster and gang runs); --outcomes: the virtual-clock outcome table (gangs, queueing,
    completion, dollars spent); --llm: the LLM-cluster mix table (files from ``bench/replay.py
    --llm-jobs``); --repeats: the pipeline mixes' outcomes over several runs of each workload."""
    if overtaken:
        for f in files:
            summary, per_gang = overtake_tables(f)
            print(f"{f.name}\n\n{OVERTAKE_HEADER}\n|" + "---|" * 3 + "---:|" * 7)
            print("\n".join(summary))
            print(f"\n{PER_GANG_HEADER}\n|" + "---|" * 5 + "---:|" * 4 + "---|---:|")
            print("\n".join(per_gang) + "\n")
        return
    if repeats:
        dropped = set()
        for item in drop:
            name, sep, variant = item.rpartition(":")
            if not sep or not name or not variant:
                raise typer.BadParameter(f"--drop {item!r}: give FILE:VARIANT")
            dropped.add((Path(name).name, variant))
        if ours_from is not None:
            dropped |= {(f.name, "ours") for f in files if not fnmatch.fnmatch(f.name, ours_from)}
        runs = repeated_runs(files, frozenset(dropped))
        if plot is not None:
            print(f"wrote {repeat_bars(runs, plot)}")
        for header, table in ((REPEAT_HEADER, repeat_rows(runs)), (VERDICT_HEADER, verdict_rows(runs))):
            print(header)
            print("|" + "---|" * 3 + "---:|" * (header.count("|") - 4))
            for r in table:
                print(r)
            print()
        return
    if merge_to is not None:
        files = [merge(files, merge_to)]
        print(f"wrote {merge_to}")
    if plot is not None:
        print(f"wrote {bars(files, plot)}")
    if llm:
        print(LLM_HEADER)
        print("|" + "---|" * 4 + "---:|" * 9)
        print("\n".join(llm_rows(files)))
        return
    header, align, make = (
        (OUTCOME_HEADER, "|" + "---|" * 3 + "---:|" * 11, outcome_rows) if outcomes
        else (HEADER, "|" + "---|" * 3 + "---:|" * 10 + "---|", rows))
    print(header)
    print(align)
    for f in files:
        for r in make(f):
            print(r)


if __name__ == "__main__":
    typer.run(main)
