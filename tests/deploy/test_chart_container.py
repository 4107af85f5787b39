"""Every shape of the chart's extender container translates into `docker run` flags (testkit.container).

The container tests (tests/integration/test_container.py) run the image with these flags; a chart
change the translation cannot honour (a new volume kind, an env source, a root user) fails here, with
only helm needed, before it reaches the image run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.container import SA_DIR, PodContext, docker_run_args, probe

from .conftest import Rendered
from .test_chart import NON_DEFAULT_SETS, PROFILE_SETS


@pytest.mark.parametrize(
    "sets", [[], ["mode=default-scheduler"], NON_DEFAULT_SETS, PROFILE_SETS],
    ids=["default", "default-scheduler", "non-default", "profiles"],
)
def test_the_extender_container_translates_with_the_charts_hardening(
    render: Callable[..., Rendered], tmp_path: Path, sets: list[str]
) -> None:
    r = render(sets=sets)
    pod = PodContext(
        name="p", namespace="llm-placement", workdir=tmp_path,
        configmaps={cm["metadata"]["name"]: cm["data"] for cm in r.all("ConfigMap")},
        service_account={"token": "t", "ca.crt": "c", "namespace": "llm-placement"},
    )
    args = docker_run_args(r.deployment(), "extender", image="local:tag", pod=pod, container_id="c")
    for flag in ("--read-only", "--cap-drop=ALL", "no-new-privileges", "65532:65532"):
        assert flag in args, (flag, args)
    mounts = [args[i + 1] for i, a in enumerate(args) if a == "-v"]
    assert any(m.endswith(":/etc/llm-placement:ro") for m in mounts)
    assert any(m.endswith(f":{SA_DIR}:ro") for m in mounts)
    assert (tmp_path / "volumes" / "extender-config" / "config.yaml").is_file()
    if sets == PROFILE_SETS:
        assert any(m.endswith(":/etc/llm-placement-profiles:ro") for m in mounts)
    c = r.containers()["extender"]
    for which in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert probe(c, which).kind == ("http" if sets == ["mode=default-scheduler"] else "exec")
