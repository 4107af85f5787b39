"""Every shape of the chart's extender container translates into `docker run` flags (testkit.container).

The container tests (tests/integration/test_container.py) run the image with these flags; a chart
change the translation cannot honour (a new volume kind, an env source, a root user) fails here, with
only helm needed, before it reaches the image run.
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from testkit.container import SA_DIR, PodContext, docker_run_args, probe

from .conftest import Rendered
from .test_chart import NON_DEFAULT_SETS, PROFILE_SETS

TLS_DIR = "/etc/llm-placement-tls"
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}
# tls.source=existing renders no Secret: the user's, with the keys docs/security.md tells them to create.
USER_SECRET = {"tls.crt": "user-cert", "tls.key": "user-key", "ca.crt": "user-ca"}


def secrets(r: Rendered) -> dict[str, dict[str, str]]:
    """The rendered Secrets' data, decoded as the kubelet writes it into a secret volume."""
    return {s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
            for s in r.all("Secret")}


@pytest.mark.skipif(os.geteuid() != 0, reason="secret volume files are owned by root, as the kubelet owns them")
@pytest.mark.parametrize(
    "sets", [[], ["mode=default-scheduler"], NON_DEFAULT_SETS, PROFILE_SETS, ["extender.tls.source=existing"],
             ["extender.tls.enabled=false"], ["mode=default-scheduler", "extender.tls.enabled=false"]],
    ids=["default", "default-scheduler", "non-default", "profiles", "tls-existing", "no-tls",
         "default-scheduler-no-tls"],
)
def test_the_extender_container_translates_with_the_charts_hardening(
    render: Callable[..., Rendered], tmp_path: Path, sets: list[str]
) -> None:
    r = render(sets=sets)
    given = secrets(r)
    tls = "extender.tls.enabled=false" not in sets
    if "extender.tls.source=existing" in sets:
        assert not given  # nothing rendered: the user's Secrets
        given = {f"{r.deployment()['metadata']['name']}-verbs-serving": USER_SECRET}
    pod = PodContext(
        name="p", namespace="llm-placement", workdir=tmp_path,
        configmaps={cm["metadata"]["name"]: cm["data"] for cm in r.all("ConfigMap")},
        secrets=given,
        service_account={"token": "t", "ca.crt": "c", "namespace": "llm-placement"},
    )
    args = docker_run_args(r.deployment(), "extender", image="local:tag", pod=pod, container_id="c")
    for flag in ("--read-only", "--cap-drop=ALL", "no-new-privileges", "65532:65532"):
        assert flag in args, (flag, args)
    mounts = [args[i + 1] for i, a in enumerate(args) if a == "-v"]
    assert any(m.endswith(":/etc/llm-placement:ro") for m in mounts)
    assert any(m.endswith(f":{SA_DIR}:ro") for m in mounts)
    config = tmp_path / "volumes" / "extender-config" / "config.yaml"
    assert config.is_file()
    if sets == PROFILE_SETS:
        assert any(m.endswith(":/etc/llm-placement-profiles:ro") for m in mounts)
    settings = yaml.safe_load(config.read_text())
    served = [m.split(":")[0] for m in mounts if m.endswith(f":{TLS_DIR}:ro")]
    if tls:
        # The files the extender's config names are the Secret's, readable by the pod's user only
        # through its fsGroup (0440 root:65532).
        (src,) = served
        files = {f.name: f for f in Path(src).iterdir()}
        assert set(files) == TLS_KEYS
        for key in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
            path = Path(settings[key])
            assert str(path.parent) == TLS_DIR and path.name in files, (key, path)
        for f in files.values():
            st = f.stat()
            assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o440, 0, 65532), f
    else:
        assert not served and not any(k.startswith("tls_") for k in settings)
    c = r.containers()["extender"]
    http = "mode=default-scheduler" in sets
    for which in ("startupProbe", "livenessProbe", "readinessProbe"):
        p = probe(c, which)
        assert p.kind == ("http" if http else "exec")
        if http:
            assert p.scheme == ("HTTPS" if tls else "HTTP")
        else:
            assert ("https://127.0.0.1" in p.command[-1]) == tls, p.command
