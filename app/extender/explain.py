"""Explain a decision: per node feasibility, the rule that rejected it, score terms and weights.

Pure over the service's snapshot and placer (no HTTP), so the API, the CLI and tests share it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from app.base.reasons import problem_key
from app.base.workload import TRAINING_STAGES, ServingRole, WorkloadError, WorkloadSpec
from app.bind.binding import AGREEMENT_TEXT
from app.extender.service import ExtenderService
from app.placement.feasibility import NodeFit
from app.placement.gravity import GravityModel
from app.placement.placer import UNKNOWN
from app.placement.score_list import NodeScore
from app.placement.scoring import GRAVITY_OPENS_AT_MOST
from app.serving.live_profiles import LIVE_SOURCE_PREFIX
from app.serving.model import ServingCalibration, error_band, error_group, target_quantile


def _find_spec(service: ExtenderService, namespace: str, name: str) -> WorkloadSpec | dict[str, Any] | None:
    key = f"{namespace}/{name}"
    with service.lock:
        for spec in service.snapshot.specs.values():
            if spec.key == key:
                return spec
    if (remembered := service.remembered_by_key(key)) is not None:
        return remembered
    if service.binder is not None:
        pod = service.binder.read_pod(namespace, name)
        if pod is not None:
            try:
                return service.placer.parse(pod)
            except WorkloadError as exc:
                return {"invalid": exc.problems}
    return None


def explain_spec(service: ExtenderService, spec: WorkloadSpec) -> dict[str, Any]:
    with service.lock:
        names = sorted(service.snapshot.nodes)
        fits, rejections = service.placer.evaluate_nodes(spec, names)
        scores = {s.node: s for s in service.placer.score(spec, list(fits.values()))}
        bound = service.snapshot.node_of(spec.key)
        gravity = service.placer.gravity
        pull = (gravity.explain(spec, names, list(fits))
                if isinstance(gravity, GravityModel) and (spec.depends_on or spec.serving_group)
                else None)
        free_by_domain: Counter[str] = Counter()
        for n, facts in service.snapshot.nodes.items():
            if facts.has_gpus:
                free_by_domain[facts.nvlink_domain] += max(0, service.snapshot.free_gpus(n))
    nodes: list[dict[str, Any]] = []
    for n in names:
        entry: dict[str, Any] = {"node": n}
        if n in fits:
            entry |= _feasible_entry(service, spec, fits[n], scores.get(n))
        else:
            r = rejections.get(n) or UNKNOWN
            # "rule" is the rejections metric's label for the same verdict (docs/metrics.md).
            entry |= {"feasible": False, "rule": r.code.value, "reason": r.message,
                      "unresolvable": r.unresolvable}
        if pull is not None and n in pull["nodes"]:
            entry["gravity"] = pull["nodes"][n]  # distance to each producer and the transfer cost
        nodes.append(entry)
    ranked = sorted((e for e in nodes if e["feasible"]), key=lambda e: (-e["score"], -e["total"], e["node"]))
    reasons = Counter(e["reason"] for e in nodes if not e["feasible"])
    summary: str
    remembered = service.remembered(spec.uid) if spec.uid else None
    agreed = remembered.agreement if remembered is not None else None
    if bound and not bound[1]:
        summary = f"bound to {bound[0]}"
        if agreed is not None:
            summary += f" ({AGREEMENT_TEXT[agreed]})"
    elif ranked:
        summary = f"best node {ranked[0]['node']} (score {ranked[0]['score']})"
    elif reasons:
        reason, count = reasons.most_common(1)[0]
        summary = f"pending: {count}/{len(names)} nodes: {reason}"
    else:
        summary = "pending: no nodes known"
    if spec.gpus and not ranked:
        total_free = sum(free_by_domain.values())
        summary += (f"; {total_free} GPUs free across {sum(1 for v in free_by_domain.values() if v)} "
                    f"domains; pod needs {spec.gpus}")
    return {
        "pod": spec.key,
        "stage": spec.stage.value if spec.stage else None,
        "gpus": spec.gpus,
        "model_params": spec.model_params,
        "precision": spec.precision.value,
        "finetune_method": spec.effective_finetune_method.value if spec.stage in TRAINING_STAGES else None,
        "active_params": spec.active_params,
        "gang": spec.gang.key if spec.gang else None,
        # Its place in the gang queue and the gangs ahead it waits behind (docs/gangs.md).
        "gang_queue": (service.gangs.queue_info(spec.gang.key)
                       if spec.gang and service.gangs is not None else None),
        # What the pod's DRA claims say, as read (docs/dra.md): MIG slices, the recognised
        # selectors' restrictions, and the selectors whose decision is kube-scheduler's alone.
        "claims": _claims(spec),
        "bound_node": bound[0] if bound and not bound[1] else None,
        "chosen": ranked[0]["node"] if ranked else None,
        "runner_up": ranked[1]["node"] if len(ranked) > 1 else None,
        # At bind time, against the scores kube-scheduler received (top, tied_top, lower, unranked).
        "scheduler_agreement": agreed.value if agreed is not None else None,
        "summary": summary,
        "free_gpus_by_domain": dict(free_by_domain),
        "gravity": None if pull is None else {
            **{k: v for k, v in pull.items() if k != "nodes"},
            "tradeoff": _gravity_tradeoff(pull, fits, ranked[0]["node"] if ranked else None),
        },
        # What the pod's own engine measures against its own targets, once two steady windows
        # agree (docs/stage-policy.md, "Targets the engines measure missed"); None when not judged.
        "serving_targets": _targets_note(service, spec),
        "nodes": nodes,
    }


def _targets_note(service: ExtenderService, spec: WorkloadSpec) -> list[str] | None:
    watch = service.serving_targets
    verdicts = watch.of(spec.key) if watch is not None else []
    return [v.line() for v in verdicts] or None


def _feasible_entry(service: ExtenderService, spec: WorkloadSpec, f: NodeFit, s: NodeScore | None
                    ) -> dict[str, Any]:
    """What explain says about a node that passes: the fit, its figures' sources and the score."""
    out: dict[str, Any] = {
        "feasible": True,
        "gpu": f.node.gpu.name if f.node.gpu else None,
        "precision": f.sizing.precision.value,
        "per_gpu_gb": round(f.sizing.per_gpu_gb, 2),
        # What per_gpu_gb (or the host memory) is made of (docs/stage-policy.md).
        "memory_breakdown": {k: round(v, 2) for k, v in f.sizing.breakdown},
        "ms_per_token": round(f.ms_per_token, 2) if f.ms_per_token else None,
        "ttft_ms": round(f.ttft_ms, 1) if f.ttft_ms else None,
        # Whether each figure is a measurement (settings profiles_file) or the estimate
        # (docs/stage-policy.md, "Measured profiles"); the estimate is kept for calibration.
        "ms_per_token_source": f.ms_source if f.ms_per_token else None,
        "ttft_source": f.ttft_source if f.ttft_ms else None,
        "estimated_ms_per_token": (round(f.estimated_ms_per_token, 2)
                                   if f.profile is not None and f.estimated_ms_per_token else None),
        "estimated_ttft_ms": (round(f.estimated_ttft_ms, 1)
                              if f.profile is not None and f.estimated_ttft_ms else None),
        "profile": None if f.profile is None else {
            "model": f.profile.model, "gpu": f.profile.gpu, "gpus": f.profile.gpus,
            "precision": f.profile.precision.value, "source": f.profile.source,
            "max_concurrency": f.profile.max_concurrency,
        },
        # The all-reduce part of ms_per_token and ttft_ms for multi-GPU serving
        # (docs/stage-policy.md, "Tensor-parallel communication").
        "tensor_parallel": None if f.tp is None else {
            "gpus": f.tp.gpus, "link": f.tp.link.name, "link_kind": f.tp.link.kind,
            "link_gb_per_s": f.tp.link.gb_per_s,
            "ms_per_token": round(f.tp.per_token_ms, 3),
            "prefill_ms": round(f.tp.prefill_ms, 1),
        },
        # The serving model's parts, how far off it was on published measurements of
        # pods like this one, and what decided (docs/stage-policy.md, "The serving model").
        "serving_model": None if f.estimate is None else _serving_note(service, spec, f),
        "hourly_cost": round(f.pod_hourly_cost, 4),
        "score": s.score if s else 0,
        "total": round(s.total, 4) if s else 0.0,
        "terms": {t: round(v, 3) for t, v in (s.terms if s else {}).items()},
        "weights": s.weights if s else {},
    }
    if s is not None and s.guarded_by:
        # Ranked just below a partly used node (docs/scoring.md, "The whole-node guard").
        out["whole_node_guard"] = _guard_note(service, f.node.name, s.guarded_by)
    if s is not None and s.gravity_capped == "opens":
        # docs/data-gravity.md, "Never a whole node far bigger than the pod".
        out["gravity_not_counted"] = (
            f"the pod would open this whole {f.node.gpu_count}-GPU node for {spec.gpus} GPU(s): data "
            f"gravity opens no node of more than {GRAVITY_OPENS_AT_MOST}x the pod's GPUs while a "
            "partly used or smaller node fits; its pull is capped at theirs")
    elif s is not None and s.gravity_capped == "outclassed":
        # docs/data-gravity.md, "Never onto slower, dearer training hardware".
        out["gravity_not_counted"] = (
            f"another candidate's GPU trains at least as fast as this {f.node.gpu_product or 'GPU'} and "
            "costs less per unit of work: reading inputs faster here never pays for hours of slower "
            "training, so its pull is capped at the best pull among those candidates")
    return out


def _gravity_tradeoff(pull: dict[str, Any], fits: Mapping[str, NodeFit], chosen: str | None
                      ) -> dict[str, Any] | None:
    """When the chosen node is not the one its inputs reach fastest: what reading them from there
    costs in seconds, and what the chosen node saves (or costs) per hour, so a placement away from
    the data can be judged in seconds and dollars (docs/data-gravity.md)."""
    at = {n: d["seconds"] for n, d in pull["nodes"].items() if n in fits}
    if chosen is None or chosen not in at or not at:
        return None
    closest = min(at, key=lambda n: (at[n], fits[n].pod_hourly_cost, n))
    if closest == chosen or at[closest] >= at[chosen]:
        return {"chosen_is_closest": True}
    extra_s = at[chosen] - at[closest]
    saved = fits[closest].pod_hourly_cost - fits[chosen].pod_hourly_cost
    return {
        "chosen_is_closest": False, "closest": closest,
        "extra_transfer_seconds": round(extra_s, 3),
        "hourly_cost_saved": round(saved, 4),
        "summary": (f"{chosen} reads the inputs {extra_s:.1f} s slower than {closest}, and costs "
                    + (f"${saved:.2f}/h less" if saved >= 0 else f"${-saved:.2f}/h more")
                    + "; the other terms (packing, price, hardware fit) outweighed the transfer"),
    }


def _claims(spec: WorkloadSpec) -> dict[str, Any] | None:
    if not (spec.mig_slices or spec.gpu_products or spec.gpu_min_memory_gb or spec.claim_notes):
        return None
    return {
        "mig_slices": spec.mig_slices,
        "mig_profiles": list(spec.mig_profiles),
        "mig_min_memory_gb": round(spec.mig_min_memory_gb, 1),
        "gpu_products": [f"{how} {', '.join(v)}" for how, v in spec.gpu_products],
        "gpu_min_memory_gb": round(spec.gpu_min_memory_gb, 1),
        "left_to_kube_scheduler": list(spec.claim_notes),
    }


def explain_pod(service: ExtenderService, namespace: str, name: str) -> dict[str, Any] | None:
    found = _find_spec(service, namespace, name)
    if found is None:
        return None
    if isinstance(found, dict):
        problems = found["invalid"]
        return {"pod": f"{namespace}/{name}", "summary": "invalid annotations: " + "; ".join(problems),
                "invalid": problems, "invalid_keys": [problem_key(p) for p in problems], "nodes": []}
    return explain_spec(service, found)


def _guard_note(service: ExtenderService, node: str, sibling: str) -> str:
    """Say which of the guard's rules ranked ``node`` down: same shape, or across shapes."""
    nodes = service.snapshot.nodes
    mine, theirs = nodes.get(node), nodes.get(sibling)
    if mine is not None and theirs is not None and mine.shape_id == theirs.shape_id:
        return f"kept whole: {sibling} (same shape, partly used) fits"
    return (f"kept whole: {sibling} (partly used, as fast, price premium below the idle cost of the "
            "GPUs this node would strand) fits")


def _holds(fit: NodeFit) -> str | None:
    clients, held = fit.sizing.clients, fit.clients_held
    if not clients or held is None:
        return None
    if held >= clients:
        return f"all {clients} clients at once"
    return f"{held} of {clients} clients at once; the rest queue (latency estimated at {held})"


def _quantile_note(cal: ServingCalibration, group: str, metric: str, confidence: float, clients: int,
                   engine: str | None) -> dict[str, Any]:
    q = target_quantile(cal, group, metric, confidence, clients, engine)
    return {"confidence": confidence, "quantile": round(q.factor, 3), "group": q.group, "points": q.n}


def _decisions(spec: WorkloadSpec, fit: NodeFit, group: str, cal: ServingCalibration,
               confidence: float, clients: int) -> list[str]:
    """One line per estimated target: ``meets 40 ms/token at 90 % confidence: estimate 31 ms x q90
    1.18 = 36.6 ms`` (docs/stage-policy.md, "Target decision")."""
    assert fit.estimate is not None
    out = []
    pct = f"{confidence * 100:g} %"
    if (spec.max_ms_per_token is not None and spec.serving_role is not ServingRole.PREFILL
            and (fit.profile is None or fit.profile.ms_per_token is None)):
        q = target_quantile(cal, group, "tpot", confidence, clients, spec.serving_engine)
        out.append(f"meets {spec.max_ms_per_token:g} ms/token at {pct} confidence: "
                   f"{q.says(fit.estimate.ms_per_token)} ({q.group}, {q.n} points)")
    if spec.max_ttft_ms is not None and fit.ttft_ms is not None and fit.estimated_ttft_ms is not None \
            and fit.ttft_ms == fit.estimated_ttft_ms:
        q = target_quantile(cal, group, "ttft", confidence, clients, spec.serving_engine)
        out.append(f"meets {spec.max_ttft_ms:g} ms to first token at {pct} confidence: "
                   f"{q.says(fit.estimate.ttft_ms)} ({q.group}, {q.n} points)")
    return out


def _serving_note(service: ExtenderService, spec: WorkloadSpec, fit: NodeFit) -> dict[str, Any]:
    assert fit.estimate is not None
    policy = service.placer.policy.feasibility
    clients = fit.clients_held or spec.concurrency or policy.default_concurrency
    group = error_group(spec, fit.sizing.precision, clients)
    learnt = fit.profile is not None and fit.profile.source.startswith(LIVE_SOURCE_PREFIX)
    decided = ("estimate" if fit.profile is None
               else "learnt profile (live serving metrics)" if learnt else "measured profile")
    return {
        "estimated_ms_per_token": round(fit.estimate.ms_per_token, 2),
        "estimated_ttft_ms": round(fit.estimate.ttft_ms, 1),
        "parts_ms": {k: round(v, 3) for k, v in fit.estimate.parts},
        # Engines page the KV cache and queue what it cannot hold (docs/stage-policy.md).
        "kv_cache_holds": _holds(fit),
        "error_band": error_band(policy.serving, group),
        # What the estimate was multiplied by before it was compared with the pod's targets: the
        # quantile of measured / estimate at the configured confidence (unused for measured).
        "target_quantile": {m: _quantile_note(policy.serving, group, m, policy.serving_confidence, clients,
                                              spec.serving_engine) for m in ("tpot", "ttft")},
        "target_decision": _decisions(spec, fit, group, policy.serving, policy.serving_confidence, clients),
        "decided_by": decided,
        # Which pods, engine and window a learnt profile came from; a measured one's own source.
        "profile_source": None if fit.profile is None else fit.profile.source,
        "measured_ms_per_token": None if fit.profile is None else fit.profile.ms_per_token,
        "measured_ttft_ms": None if fit.profile is None else fit.profile.ttft_ms,
    }

