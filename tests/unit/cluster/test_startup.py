"""Start-up: credentials resolved as kubectl does, failures in one or two lines, metrics on loopback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.cluster.client import CredentialsError, api_client, resolve_credentials
from app.config.settings import Settings

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_order_is_flag_then_kubeconfig_env_then_home_then_in_cluster(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    flag, env_file = tmp_path / "flag", tmp_path / "env"
    for f in (flag, env_file, home / ".kube" / "config"):
        f.write_text(KUBECONFIG)
    env = {"KUBECONFIG": f"/nonexistent:{env_file}", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
           "KUBERNETES_SERVICE_PORT": "443"}
    assert resolve_credentials(str(flag), env, home) == ("--kubeconfig/LLMP_KUBECONFIG", str(flag))
    assert resolve_credentials(None, env, home)[0] == "KUBECONFIG"
    del env["KUBECONFIG"]
    assert resolve_credentials(None, env, home) == ("~/.kube/config", str(home / ".kube" / "config"))
    assert resolve_credentials(None, env, tmp_path / "nohome") == ("in-cluster service account", None)
    with pytest.raises(CredentialsError, match="pass --kubeconfig, set LLMP_KUBECONFIG or KUBECONFIG"):
        resolve_credentials(None, {}, tmp_path / "nohome")


def test_home_kubeconfig_is_used_without_any_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(KUBECONFIG)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    api = api_client(None)
    assert api.configuration.host == "https://127.0.0.1:1"


def test_serve_without_credentials_fails_in_one_or_two_lines(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("KUBECONFIG", "LLMP_KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
                "LLMP_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    result = CliRunner().invoke(cli, ["serve", "--port", "18888"])
    out = result.output.strip().splitlines()
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert 1 <= len(out) <= 2 and "KUBECONFIG" in result.output, result.output
    bad = tmp_path / "bad"
    bad.write_text("not: [a kubeconfig")
    result = CliRunner().invoke(cli, ["serve", "--kubeconfig", str(bad)])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) <= 2, result.output


def test_taken_metrics_port_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        monkeypatch.setenv("LLMP_CLUSTER_SOURCE", "none")
        monkeypatch.setenv("LLMP_METRICS_PORT", str(port))
        result = CliRunner().invoke(cli, ["serve", "--port", "18889"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2 and "metrics" in result.output, result.output


def test_metrics_listen_on_loopback_unless_configured() -> None:
    assert Settings().metrics_host == "127.0.0.1"
