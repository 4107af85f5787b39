"""One estimate per pod, whichever way it is written: a mixture of experts named by its registry
``model`` and the same model given as parameter counts get the same serving estimate
(docs/annotations.md, ``model``)."""

from __future__ import annotations

from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.model_registry import ModelArch, default_registry
from app.base.objects import pod_object
from app.base.workload import MODEL_PARAMS_TOLERANCE, Precision, parse_workload
from app.serving.model import serving_estimate

ANN = "llm-placement.io/"
MOES = [a for a in default_registry() if a.moe is not None and a.active_params is not None]
H100 = next(g for g in GpuCatalog.load() if g.name == "H100-SXM-80GB")


class Defaults:
    default_context_tokens = 4096
    default_concurrency = 1

    @property
    def serving(self) -> Any:
        from app.serving.model import default_calibration
        return default_calibration()


def spec(**ann: str) -> Any:
    return parse_workload(pod_object("p", stage="serving", gpus=8, annotations={
        ANN + k.replace("_", "-"): v for k, v in {"precision": "fp8", **ann}.items()}))


def rounded(value: float) -> str:
    """A count as a user writes it: three significant figures ("46.7B")."""
    return f"{float(f'{value / 1e9:.3g}'):g}B"


@pytest.mark.parametrize("arch", MOES, ids=[a.name for a in MOES])
@pytest.mark.parametrize(("clients", "prompt"), [(1, 2000), (16, 2000), (64, 922)])
def test_a_moe_named_and_counted_gets_one_estimate(arch: ModelArch, clients: int, prompt: int) -> None:
    assert arch.active_params is not None
    load = {"concurrency": str(clients), "prompt_tokens": str(prompt), "context_tokens": str(2 * prompt)}
    named = spec(model=arch.name, **load)
    counted = spec(model_params=rounded(arch.params), active_params=rounded(arch.active_params), **load)
    a = serving_estimate(named, Precision.FP8, H100, 0.0, Defaults())
    b = serving_estimate(counted, Precision.FP8, H100, 0.0, Defaults())
    assert b.ms_per_token == pytest.approx(a.ms_per_token, rel=0.10)
    assert b.ttft_ms == pytest.approx(a.ttft_ms, rel=0.10)
    assert counted.model == arch.name  # explain names the model the counts matched


def test_counts_that_match_no_moe_keep_the_size_rule() -> None:
    arch = MOES[0]
    assert arch.active_params is not None
    # Twice the tolerance away on the active count: no entry is named, the size rule estimates.
    off = arch.active_params * (1 + 2 * MODEL_PARAMS_TOLERANCE)
    assert spec(model_params=rounded(arch.params), active_params=rounded(off)).model is None
    # Dense counts never name a model (several dense models share a size).
    assert spec(model_params="70B").model is None
