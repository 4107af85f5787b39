"""`llm-placement config validate FILE`: one line per bad field with its path, exit status 2 on any."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.config.settings import API_VERSION, KIND

HEADER = f"apiVersion: {API_VERSION}\nkind: {KIND}\n"


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command reads the file as serve does, environment included: keep the runner's out of it.
    for name in [n for n in os.environ if n.startswith("LLMP_")]:
        monkeypatch.delenv(name)


def _run(tmp_path: Path, text: str) -> tuple[int, list[str], list[str]]:
    """Exit status, standard output's lines and standard error's lines."""
    f = tmp_path / "settings.yaml"
    f.write_text(text)
    result = CliRunner().invoke(cli, ["config", "validate", str(f)])
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout.strip().splitlines(), result.stderr.strip().splitlines()


def _validate(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    """A versioned file's check: no warnings, status and lines."""
    code, out, err = _run(tmp_path, HEADER + text)
    assert err == []
    return code, out


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
    code, lines, _ = _run(tmp_path, "- 1\n")
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


@pytest.mark.parametrize(("text", "expected"), [
    ("apiVersion: config.llm-placement.io/v2\nkind: ExtenderConfiguration\n",
     [f"apiVersion: 'config.llm-placement.io/v2' is not read; expected {API_VERSION}"]),
    (f"apiVersion: {API_VERSION}\nkind: KubeSchedulerConfiguration\n",
     [f"kind: 'KubeSchedulerConfiguration' is not read; expected {KIND}"]),
    (f"apiVersion: {API_VERSION}\n", [f"kind: required with apiVersion; expected {KIND}"]),
    (f"kind: {KIND}\nport: 0\n",
     [f"apiVersion: required with kind; expected {API_VERSION}", "port: must be >= 1"]),
    # Feature gates: unknown ones by their path, bad values by theirs, the known ones still checked.
    (HEADER + "feature_gates: {NoSuchGate: true, WholeNodeGuard: maybe}\n",
     ["feature_gates.NoSuchGate: unknown feature gate; expected one of WholeNodeGuard, CrossShapeGuard, "
      "ScoreRankBands, FilterToBest, DefaultTargetFilter",
      "feature_gates.WholeNodeGuard: Input should be a valid boolean, unable to interpret input"]),
    # An old name with a value it never took is named by the old name.
    (HEADER + "filter_to_best: sometimes\nport: 0\n",
     ["filter_to_best: must be 'auto' or 'off', not 'sometimes'", "port: must be >= 1"]),
    (HEADER + "stranded_idle_share: 2\n", ["stranded_idle_share: must be between 0 and 1, not 2"]),
])
def test_version_kind_and_gates_are_checked_one_line_each(tmp_path: Path, text: str, expected: list[str]) -> None:
    code, out, _ = _run(tmp_path, text)
    assert code == 2 and out == expected


@pytest.mark.parametrize(("text", "warning"), [
    ("port: 9000\n", f"has no apiVersion and kind: it is read as {API_VERSION} until 0.2.0"),
    (HEADER + "whole_node_guard: false\n", "whole_node_guard is deprecated: set feature_gates.WholeNodeGuard"),
    (HEADER + "gil_switch_interval_seconds: 0.001\n", "gil_switch_interval_seconds is no longer read"),
])
def test_a_deprecated_form_passes_with_one_warning_on_stderr(tmp_path: Path, text: str, warning: str) -> None:
    code, out, err = _run(tmp_path, text)
    assert code == 0 and len(out) == 1 and out[0].endswith(": OK")
    assert len(err) == 1 and err[0].startswith("warning: ") and warning in err[0], err


def test_dump_rewrites_an_old_file_into_one_that_validates_without_warnings(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("port: 9000\nwhole_node_guard: false\nweights:\n  serving: {cost: 5}\n")
    result = CliRunner().invoke(cli, ["config", "dump", str(old)])
    assert result.exit_code == 0 and len(result.stderr.strip().splitlines()) == 2  # two deprecations
    assert result.stdout == (f"{HEADER}port: 9000\nweights:\n  serving:\n    cost: 5.0\n"
                             "feature_gates:\n  WholeNodeGuard: false\n")
    code, out, err = _run(tmp_path, result.stdout)
    assert code == 0 and err == [] and out[0].endswith(": OK")
