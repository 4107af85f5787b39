"""`llm-placement config validate FILE`: one line per bad field with its path, exit status 2 on any."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command reads the file as serve does, environment included: keep the runner's out of it.
    for name in [n for n in os.environ if n.startswith("LLMP_")]:
        monkeypatch.delenv(name)


def _validate(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    f = tmp_path / "settings.yaml"
    f.write_text(text)
    result = CliRunner().invoke(cli, ["config", "validate", str(f)])
    assert "Traceback" not in result.output
    return result.exit_code, result.output.strip().splitlines()


@pytest.mark.parametrize("text", [
    "",  # every default
    "port: 9000\nweights:\n  serving: {cost: 7}\n",
    "live_profiles: {prometheus_url: 'http://prometheus:9090'}\n",
    "labels:\n  gpu_resource: [nvidia.com/gpu, amd.com/gpu]\n",
])
def test_a_valid_file_is_one_ok_line(tmp_path: Path, text: str) -> None:
    code, lines = _validate(tmp_path, text)
    assert code == 0 and len(lines) == 1 and lines[0].endswith(": OK"), lines


@pytest.mark.parametrize(("text", "expected"), [
    ("weights:\n  serving: {cost: -1}\n", ["weights.serving.cost: must be >= 0"]),
    ("port: 70000\n", ["port: must be <= 65535"]),
    ("memory_headroom: 0.9\n", ["memory_headroom: must be <= 0.5"]),
    ("solver_time_limit_seconds: 0\n", ["solver_time_limit_seconds: must be > 0"]),
    # Unknown keys, at the top and nested, with their paths.
    ("no_such_key: 1\n", ["no_such_key: unknown key"]),
    ("labels: {bogus: x}\n", ["labels.bogus: unknown key"]),
    ("weights:\n  serving: {bogus: 2}\n", ["weights.serving.bogus: unknown key"]),
    ("live_profiles: {prometheus_url: 'http://p', colour: red}\n", ["live_profiles.colour: unknown key"]),
    ("tier_bandwidth_gbps: {cross_zone: .inf}\n", ["tier_bandwidth_gbps.cross_zone: Input should be a finite number"]),
    # Every bad field of one file, each on its own line, in the settings' order.
    ("port: 0\nmemory_headroom: 0.9\nno_such_key: 1\n",
     ["port: must be >= 1", "memory_headroom: must be <= 0.5", "no_such_key: unknown key"]),
    ("weights:\n  serving: {cost: -1, bogus: 2}\n  alignment: {packing: -3}\n",
     ["weights.alignment.packing: must be >= 0", "weights.serving.cost: must be >= 0",
      "weights.serving.bogus: unknown key"]),
    # An unknown stage is named by its path, and the known stages' weights are still checked.
    ("weights:\n  training: {cost: 1}\n  serving: {cost: -1}\n",
     ["weights.training: unknown stage; expected one of data-prep, pretraining, alignment, deployment, serving",
      "weights.serving.cost: must be >= 0"]),
    # A check across settings names its keys in its message.
    ("gang_reservation_ttl_seconds: 2\ngang_bind_timeout_seconds: 3\n",
     ["gang_reservation_ttl_seconds (2) must be longer than gang_bind_timeout_seconds (3)"]),
])
def test_each_bad_field_is_one_line_with_its_path(tmp_path: Path, text: str, expected: list[str]) -> None:
    code, lines = _validate(tmp_path, text)
    assert code == 2 and lines == expected


def test_a_file_that_is_not_a_mapping_is_one_line(tmp_path: Path) -> None:
    code, lines = _validate(tmp_path, "- 1\n")
    assert code == 2 and lines == [f"config file {tmp_path / 'settings.yaml'}: top level must be a mapping"]


def test_an_unreadable_file_is_one_line_and_status_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["config", "validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"cannot read config file {tmp_path / 'missing.yaml'}: cannot read: No such file or directory"]


def test_the_file_is_read_as_serve_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The environment overrides the file for serve, so a bad LLMP_* value fails validation too.
    monkeypatch.setenv("LLMP_PORT", "0")
    code, lines = _validate(tmp_path, "port: 9000\n")
    assert code == 2 and lines == ["port: must be >= 1"]
