"""How long a task takes on a node: given, or estimated from the work with the sizing model.

* Pretraining / alignment: ``6 x params x tokens`` FLOPs (forward + backward, the usual dense
  transformer count) at ``TRAIN_MFU`` of the GPUs' dense BF16 throughput (the catalog's peak; for
  a product the catalog lacks, the node facts' declared, inferred or penalty figure).
* Serving-class tasks (eval, serve): decode is memory-bound (docs/stage-policy.md), so each generated
  token costs the predicted ms/token of ``app.serving.sizing``; ``concurrency`` streams share it.
* Anything else (data-prep, quantisation) has no portable work measure: it must give ``duration``.
"""

from __future__ import annotations

import math

from app.base.workload import TRAINING_STAGES, Stage, WorkloadSpec
from app.placement.feasibility import NodeFit
from app.snapshot.nodes import NodeFacts, work_tflops

# Share of peak dense BF16 FLOPS that large training jobs sustain (model FLOPs utilisation); 35-45%
# is what well-tuned FSDP/Megatron runs report on Hopper-class GPUs.
TRAIN_MFU = 0.4
# An estimate beyond this is a mistake in the inputs (a token count off by 1000x), not a plan.
MAX_ESTIMATE_SECONDS = 365 * 86400


class EstimateError(ValueError):
    """No duration given and none can be estimated; the message says what to add."""


def task_seconds(
    name: str, spec: WorkloadSpec, fit: NodeFit, node: NodeFacts, *,
    duration: float | None, tokens: float | None, default_concurrency: int,
) -> int:
    """Whole seconds (at least 1) ``spec`` runs on ``node`` given its feasibility verdict ``fit``."""
    if duration is not None:
        return max(1, math.ceil(duration))
    if tokens is None:
        raise EstimateError(f"task {name}: give duration (e.g. 40m), or tokens for a GPU training "
                            "or serving-class task")
    if spec.model_params is None:
        raise EstimateError(f"task {name}: tokens need model_params to estimate a duration")
    if spec.stage in TRAINING_STAGES:
        if spec.gpus <= 0 or (tflops := work_tflops(node)) <= 0:
            raise EstimateError(f"task {name}: training from tokens needs GPUs")
        # The GPU's dense BF16 throughput as the scorer prices work (docs/node-facts.md,
        # "Throughput"): a product the catalog lacks is declared, inferred or penalised alike.
        flops = 6.0 * spec.model_params * tokens
        return _capped(name, node, flops / (spec.gpus * tflops * 1e12 * TRAIN_MFU))
    if spec.stage is Stage.SERVING and fit.ms_per_token is not None:
        streams = spec.concurrency or default_concurrency
        return _capped(name, node, tokens * fit.ms_per_token / 1000.0 / streams)
    raise EstimateError(f"task {name}: tokens estimate durations only for training and serving-class "
                        "stages; give duration")


def _capped(name: str, node: NodeFacts, seconds: float) -> int:
    if not seconds <= MAX_ESTIMATE_SECONDS:
        raise EstimateError(f"task {name}: estimated {seconds / 86400 / 365:.3g} years on {node.name}; "
                            "check tokens and model_params, or give duration")
    return max(1, math.ceil(seconds))
