"""Training gangs run in lockstep: every step waits for the slowest member, so a gang spread over a
fast and a slow GPU model runs all of it at the slow one's speed while paying for the fast one.

The planner prefers one GPU model whenever a plan on one exists now (docs/gangs.md, objective group
3) but, when none does, starts the gang mixed rather than wait. Replayed through kube-scheduler with
run time from measured training throughput (BENCHMARKS.md, section 4), mixed H100 + A100 gangs ran at
A100 speed and paid H100 hours for it: the largest share of the dollars a variant spent above the
cheapest placement. So a training gang whose plan mixes GPU models that differ in speed waits, as
long as one model could hold the whole gang once its nodes are free; a gang no single model can hold
starts mixed, and so do gangs with members already bound (they stay where they are). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.base.catalog import GpuSpec
from app.base.workload import TRAINING_STAGES, WorkloadSpec
from app.gang.instance import GangInstance
from app.gang.problem import Assignment

# Models whose dense BF16 peaks differ by more than this are not mixed in one training gang while
# one of them could hold it. H100 against A100 is 3.2x; H100 SXM against H100 PCIe 1.3x.
MAX_SPEED_RATIO = 1.25


def waits_for_one_model(inst: GangInstance, spec: WorkloadSpec, assignment: Assignment,
                        gpus: Mapping[str, GpuSpec]) -> str | None:
    """Why the gang should wait for one GPU model instead of taking this mixed plan, or None.

    ``gpus``: the GPU of each node by name (nodes without a known GPU never make a plan wait)."""
    if spec.stage not in TRAINING_STAGES or spec.gpus <= 0 or inst.bound:
        return None
    used = {gpus[n].name: gpus[n] for n in assignment if n in gpus}
    if len(used) < 2:
        return None
    slow = min(used.values(), key=lambda g: g.bf16_tflops)
    fast = max(used.values(), key=lambda g: g.bf16_tflops)
    if slow.bf16_tflops <= 0 or fast.bf16_tflops / slow.bf16_tflops <= MAX_SPEED_RATIO:
        return None
    # Every node of a model counts, busy or not (the instance keeps GPU nodes kube-scheduler did not
    # offer as context): the question is whether waiting can ever end on one model.
    ratio = fast.bf16_tflops / slow.bf16_tflops
    shapes = [s for s in inst.problem.shapes if s.gpus > 0]
    for model in sorted(used, key=lambda m: -used[m].bf16_tflops):
        nodes = [c for c in inst.problem.nodes if (g := gpus.get(c.name)) is not None and g.name == model]
        if all(sum(c.total_gpus // s.gpus for c in nodes) >= s.count for s in shapes):
            return (f"waiting for one GPU model: the only plan now mixes {fast.name} and {slow.name}, and a "
                    f"lockstep gang runs every member at the slower one's speed ({ratio:.1f}x by dense "
                    f"BF16 peak); {model} nodes hold the whole gang once free")
    return None
