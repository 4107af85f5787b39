"""The embedded default: place the bundled workload on the bundled cluster, no cluster needed.

What-if only: the placements come from the simulator (``app.sim.scheduler``), which replays
kube-scheduler's cycle with the chart's shipped profile and our extender in-process. On a cluster,
kube-scheduler makes the final choice; ``llm-placement explain`` shows what it did.
"""

from __future__ import annotations

from pathlib import Path

from app.base.catalog import GpuCatalog
from app.base.objects import expand_cluster, expand_workload, load_yaml
from app.base.workload import TRAINING_STAGES, FinetuneMethod, ServingRole
from app.config.settings import Settings
from app.extender.service import ExtenderService
from app.extender.wiring import build_core
from app.sim.profile import SchedulerProfile, shipped_profile
from app.sim.scheduler import WHAT_IF, Placement, SimScheduler

# Example measured profiles (illustrative figures, labelled so in the file) that the demo reads
# when the settings name none, so one placement shows a measurement overriding the estimate
# (docs/stage-policy.md, "Measured profiles").
EXAMPLE_PROFILES = Path(__file__).with_name("profiles.yaml")


def with_profiles(settings: Settings, profiles: str | Path | None) -> Settings:
    """``settings`` reading ``profiles`` unless they already name a profiles file of their own."""
    if settings.profiles_file or profiles is None:
        return settings
    # Settings are frozen and load the file in a validator: build them anew rather than copy.
    return type(settings)(**{**settings.model_dump(), "profiles_file": str(profiles)})


def demo_header(profile: SchedulerProfile | None = None) -> str:
    """The first line of the demo's output: what produced these placements."""
    p = profile or shipped_profile()
    return (f"{WHAT_IF}: kube-scheduler's cycle replayed in-process, not a cluster's decisions. "
            f"Profile {p.describe()}")


def run_demo(
    settings: Settings, cluster: str | Path | None = None, workload: str | Path | None = None,
    *, seed: int = 0, profiles: str | Path | None = EXAMPLE_PROFILES,
) -> tuple[ExtenderService, list[Placement]]:
    """Place the workload; ``profiles`` (the bundled example by default) applies only when the
    settings name no profiles file, and ``None`` runs on the estimates alone."""
    service = build_core(with_profiles(settings, profiles), GpuCatalog.load())
    for node in expand_cluster(load_yaml(cluster, "cluster.yaml")):
        service.absorb_node(node)
    pods = expand_workload(load_yaml(workload, "workload.yaml"))
    sim = SimScheduler(service.placer, shipped_profile(), seed=seed)
    sim.admit(pods)
    return service, [sim.schedule(p) for p in pods]


def notes(p: Placement) -> list[str]:
    """What a placement owes to the sizing of today's workloads, in a few words for the demo table:
    measured or estimated figures, adapters, active experts, time to first token, serving group."""
    fit, spec = p.fit, p.spec
    if fit is None or spec is None:
        return []
    out: list[str] = []
    # A prefill pod is held to its time to first token, not to ms/token (docs/stage-policy.md).
    if fit.ms_per_token is not None and spec.serving_role is not ServingRole.PREFILL:
        if fit.profile is not None and fit.profile.ms_per_token is not None:
            est = fit.estimated_ms_per_token
            out.append(f"{fit.ms_per_token:.1f} ms/token measured ({fit.profile.model}"
                       + (f"; estimate {est:.1f})" if est is not None else ")"))
        else:
            out.append(f"{fit.ms_per_token:.1f} ms/token")
    if fit.ttft_ms is not None:
        out.append(f"first token {fit.ttft_ms:.0f} ms {fit.ttft_source}")
    if (spec.stage in TRAINING_STAGES and spec.effective_finetune_method is not FinetuneMethod.FULL
            and fit.sizing.per_gpu_gb > 0):
        out.append(f"{spec.effective_finetune_method.value}: {fit.sizing.per_gpu_gb:.0f} GB per GPU")
    if spec.active_params is not None and fit.sizing.read_gb is not None:
        out.append(f"MoE reads {fit.sizing.read_gb:.1f} of {fit.sizing.weights_gb:.1f} GB per step")
    if spec.serving_group is not None:
        out.append(f"{spec.serving_role.value} of serving-group {spec.serving_group}")
    return out
