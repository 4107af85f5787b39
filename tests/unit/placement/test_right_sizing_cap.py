"""Right-sizing never sends training to a GPU another candidate beats on price per unit of work and
speed (app/placement/scoring.py, ``_cap_right_sizing``; docs/stage-policy.md, "Scoring")."""

from __future__ import annotations

from app.base.catalog import GpuCatalog
from app.base.objects import node_object
from app.config.settings import Settings
from app.extender.wiring import build_core
from app.placement.scoring import score_nodes
from tests.unit.serving.test_sizing_methods import spec_of


def ranked(stage: str, nodes: dict[str, str], **ann: str) -> tuple[list[str], dict[str, float]]:
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    for name, product in nodes.items():
        svc.absorb_node(node_object(name, gpus=4, product=product))
    spec = spec_of(stage, **ann)
    fits, _ = svc.placer.evaluate_nodes(spec, list(nodes))
    scores = score_nodes(spec, list(fits.values()), {}, svc.placer.policy.scoring)
    order = [s.node for s in sorted(scores, key=lambda s: -s.total)]
    return order, {s.node: s.terms["memory_fit"] for s in scores}


def test_lora_sft_takes_the_l40s_that_beats_the_l4_on_price_per_work_and_speed() -> None:
    # An L4 fits a LoRA 7B SFT more snugly, but an L40S is cheaper per unit of work (data-sheet
    # dense BF16 against the hourly price) and 3x faster: the L4's right-sizing is capped at the
    # L40S's, so the L40S wins on cost.
    order, memory_fit = ranked("alignment", {"l4": "NVIDIA-L4", "l40s": "NVIDIA-L40S"},
                               model_params="7B", finetune_method="lora")
    assert order[0] == "l40s"
    assert memory_fit["l4"] == memory_fit["l40s"]


def test_a_gpu_that_is_slower_but_not_dearer_per_work_keeps_its_right_sizing() -> None:
    # Against an H100 the L4 is cheaper per unit of work: not outclassed, so it keeps its snug fit.
    order, memory_fit = ranked("alignment", {"l4": "NVIDIA-L4", "h100": "NVIDIA-H100-80GB-HBM3"},
                               model_params="7B", finetune_method="lora")
    assert memory_fit["l4"] > memory_fit["h100"]
    assert order[0] == "l4"
