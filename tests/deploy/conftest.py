"""Fixtures of the deployment suite: a real helm (built from its Go module, cached) and renderers.

Real-tool tests skip only when the tool cannot be built here (no Go toolchain); a build that starts
and fails is a test failure, with the build output in the message.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "llm-placement"
RELEASE = "llm-placement"
NAMESPACE = "llm-placement"


def _build(script: str, what: str, timeout: float) -> str:
    if shutil.which("go") is None:
        pytest.skip(f"{what} cannot be built here: no Go toolchain on PATH")
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        pytest.fail(f"scripts/{script} failed ({proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    """Path of the helm binary; the first run builds it (~3.5 min cold, instant when cached)."""
    path = Path(_build("build-helm.sh", "helm", timeout=1800))
    assert path.is_file(), f"build-helm.sh printed {path!s}, which is not a file"
    return path


def cache_root() -> Path:
    return Path(os.environ.get("LLMP_CACHE") or Path.home() / ".cache" / "llm-placement")


@pytest.fixture(scope="session")
def kube_scheduler_bin() -> Path:
    """The real kube-scheduler the integration suite uses (scripts/build-controlplane.sh, cached)."""
    _build("build-controlplane.sh", "kube-scheduler", timeout=3600)
    gomod = (REPO / "tests" / "controlplane" / "go.mod").read_text()
    version = re.search(r"^require k8s\.io/kubernetes (\S+)", gomod, re.M)
    assert version, "tests/controlplane/go.mod does not require k8s.io/kubernetes"
    path = cache_root() / "controlplane" / version.group(1) / "kube-scheduler"
    assert path.is_file(), f"build-controlplane.sh succeeded but {path} is missing"
    return path


@pytest.fixture(scope="session")
def kustomize_bin() -> Path:
    """kustomize (the engine `kubectl kustomize` embeds), built from its Go module (~30 s cold)."""
    path = Path(_build("build-kustomize.sh", "kustomize", timeout=1200))
    assert path.is_file(), f"build-kustomize.sh printed {path!s}, which is not a file"
    return path


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}", pytrace=False)
    return proc


def template_args(
    chart: Path = CHART, values: dict[str, Any] | None = None, sets: list[str] | None = None,
    namespace: str = NAMESPACE, tmp: Path | None = None, api_versions: tuple[str, ...] = (),
) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", namespace]
    for v in api_versions:
        args += ["--api-versions", v]
    if values:
        assert tmp is not None, "values need a temp dir for the values file"
        vf = tmp / "values-override.yaml"
        vf.write_text(yaml.safe_dump(values))
        args += ["--values", str(vf)]
    for s in sets or []:
        args += ["--set", s]
    return args


class Rendered:
    """Parsed `helm template` output with lookups by kind and name."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(text) if d]

    def kinds(self) -> list[str]:
        return [d["kind"] for d in self.docs]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        hits = [d for d in self.all(kind) if d["metadata"]["name"].endswith(name_suffix)]
        names = [h["metadata"]["name"] for h in hits]
        assert len(hits) == 1, f"expected one {kind} named *{name_suffix}, got {names}"
        return hits[0]

    def deployment(self) -> dict[str, Any]:
        return self.one("Deployment")

    def containers(self) -> dict[str, dict[str, Any]]:
        return {c["name"]: c for c in self.deployment()["spec"]["template"]["spec"]["containers"]}

    def configmap_yaml(self, name_suffix: str, key: str) -> Any:
        return yaml.safe_load(self.one("ConfigMap", name_suffix)["data"][key])


@pytest.fixture(scope="session")
def render(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Rendered]:
    """render(values=..., sets=[...], chart=..., namespace=...) -> Rendered; fails on helm errors."""

    def _render(**kw: Any) -> Rendered:
        tmp = tmp_path_factory.mktemp("values")
        return Rendered(run_helm(helm_bin, *template_args(tmp=tmp, **kw)).stdout)

    return _render
