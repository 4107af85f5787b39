"""Settings: YAML + environment, and failures that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config.settings import ConfigError, load_settings

# These files are unversioned on purpose: the old form keeps loading (with a warning, checked in
# test_config_versioned.py) and must keep failing by key the same way.
pytestmark = pytest.mark.filterwarnings("ignore::app.config.settings.ConfigDeprecationWarning")


def test_yaml_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("port: 9999\nweights:\n  serving:\n    cost: 7\nurl_prefix: ext/\n")
    monkeypatch.setenv("LLMP_PORT", "7777")
    s = load_settings(f)
    assert s.port == 7777  # environment overrides the file
    assert s.weights["serving"].cost == 7 and s.weights["pretraining"].packing == 2  # merged with defaults
    assert s.weights["serving"].bandwidth == 1.5  # the stage's own default, not the generic one
    assert s.url_prefix == "/ext"


@pytest.mark.parametrize(("text", "key"), [
    ("port: 70000\n", "port"),
    ("weights:\n  training: {cost: 1}\n", "weights"),
    ("weights:\n  serving: {cost: -1}\n", "weights.serving.cost"),
    ("serving_calibration_file: /nonexistent/cal.yaml\n", "serving_calibration_file"),
    ("no_such_key: 1\n", "no_such_key"),
    ("gravity_negligible_seconds: -5\n", "gravity_negligible_seconds"),
    ("gravity_negligible_seconds: soon\n", "gravity_negligible_seconds"),
    ("stranded_idle_share: 1.5\n", "stranded_idle_share"),
    ("stranded_idle_share: -0.1\n", "stranded_idle_share"),
    ("stranded_idle_share: half\n", "stranded_idle_share"),
    # Infinite or NaN figures would make every node tie or nothing schedule: refused by name.
    ("weights:\n  serving: {cost: .inf}\n", "weights.serving.cost"),
    ("solver_time_limit_seconds: .inf\n", "solver_time_limit_seconds"),
    ("gang_reservation_ttl_seconds: .nan\n", "gang_reservation_ttl_seconds"),
    ("default_interactive_ms_per_token: .inf\n", "default_interactive_ms_per_token"),
    ("labels:\n  gpu_resource: []\n", "labels.gpu_resource"),
    ("max_body_bytes: 100000000000000000000\n", "max_body_bytes"),
])
def test_invalid_config_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_settings(f)
    assert key in str(exc.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_settings(bad)


def test_malformed_json_in_a_structured_environment_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMP_WEIGHTS", "[1,2")
    with pytest.raises(ConfigError) as exc:
        load_settings(None)
    assert "weights" in str(exc.value) and "\n" not in str(exc.value).strip()


ZERO_SERVING = "weights:\n  serving: {" + ", ".join(
    f"{t}: 0" for t in ("memory_fit", "bandwidth", "cost", "separation", "packing", "preference",
                        "node_class", "gravity", "precision")) + "}\n"


@pytest.mark.parametrize(("text", "key"), [
    # Every term of a stage at 0: no node could be ranked above another.
    (ZERO_SERVING, "weights.serving"),
    # Nine weights of 1e308 sum to inf, and every weighted total becomes inf/inf = NaN.
    ("weights:\n  serving: {cost: 1.0e+308}\n", "weights.serving.cost"),
    ("weights:\n  serving: {cost: 1.0e-300}\n", "weights.serving.cost"),
    # Latency targets and headroom under which no serving pod fits anywhere.
    ("default_interactive_ms_per_token: 0\n", "default_interactive_ms_per_token"),
    ("default_interactive_ms_per_token: 1.0e-9\n", "default_interactive_ms_per_token"),
    ("memory_headroom: 0.99\n", "memory_headroom"),
    ("default_context_tokens: 1000000000000\n", "default_context_tokens"),
    ("default_concurrency: 100000000\n", "default_concurrency"),
    ("unknown_gpu_hourly_cost: 1.0e+300\n", "unknown_gpu_hourly_cost"),
    ("tier_bandwidth_gbps: {cross_zone: 1.0e-300}\n", "tier_bandwidth_gbps.cross_zone"),
    ("solver_time_limit_seconds: 1.0e+12\n", "solver_time_limit_seconds"),
    ("producer_memory_seconds: 1.0e+300\n", "producer_memory_seconds"),
    # A reservation that expires before the bind barrier gives up: no gang binds whole.
    ("gang_reservation_ttl_seconds: 2\ngang_bind_timeout_seconds: 3\n", "gang_reservation_ttl_seconds"),
])
def test_settings_under_which_nothing_could_be_placed_are_refused(tmp_path: Path, text: str,
                                                                  key: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_settings(f)
    assert key in str(exc.value)


def test_every_numeric_setting_has_an_upper_bound() -> None:
    # A new numeric setting must say how large it may be (docs/README "Settings").
    from annotated_types import Le, Lt

    from app.config.policy import StageWeights, TierBandwidth
    from app.config.settings import Settings

    for model in (Settings, StageWeights, TierBandwidth):
        for name, info in model.model_fields.items():
            if info.annotation in (int, float):
                assert any(isinstance(m, Le | Lt) for m in info.metadata), f"{model.__name__}.{name}"


def test_serve_refuses_unplaceable_settings_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    monkeypatch.setenv("LLMP_WEIGHTS", '{"serving": {"cost": 1e308}}')
    result = CliRunner().invoke(cli, ["serve"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "weights.serving.cost" in result.output and len(result.output.strip().splitlines()) == 1
    monkeypatch.delenv("LLMP_WEIGHTS")
    # A long message (unknown stages listed) stays one line whatever the terminal width.
    monkeypatch.setenv("LLMP_WEIGHTS", '{"training": {"cost": 1}}')
    result = CliRunner().invoke(cli, ["serve"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "['data-prep'" in result.output  # printed as is, not eaten as console markup


def test_a_config_file_with_an_alias_bomb_is_refused_in_one_line(tmp_path: Path) -> None:
    # Nine levels of nine aliases under a real key: 600 bytes whose validation walks 387 million
    # strings once the aliases are shared objects in Python.
    lines = ['x0: &a0 "x"'] + [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    lines.append(f"weights: {{serving: {{cost: [{', '.join(['*a8'] * 9)}]}}}}")
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"cannot read config file .*aliases"):
        load_settings(f)


def test_an_oversized_config_file_is_refused_before_reading(tmp_path: Path) -> None:
    f = tmp_path / "big.yaml"
    f.write_text("# " + "x" * (5 << 20) + "\n")
    with pytest.raises(ConfigError, match="bytes; at most"):
        load_settings(f)
