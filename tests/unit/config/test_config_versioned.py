"""The versioned settings file (docs/configuration.md): it round-trips, its feature gates reach the
policies, and the forms it replaced still load, each with a warning, until the stated version."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config.docs import _inline
from app.config.policy import StageWeights
from app.config.settings import (
    API_VERSION,
    FEATURE_GATES,
    KIND,
    RENAMED,
    STAGES,
    ConfigDeprecationWarning,
    Settings,
    dump_settings,
    load_settings,
)
from app.placement.ranking import ScoreMapping

# Paths that must name readable files; the generated settings leave them unset.
FILES = ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "profiles_file", "serving_calibration_file")


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("LLMP_")]:
        monkeypatch.delenv(name)
    yield


def _from_schema(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid under one node of the settings' own JSON schema (bounds, enums, lengths)."""
    kind = node.get("type")
    if isinstance(kind, list):
        return st.none() | _from_schema({**node, "type": next(k for k in kind if k != "null")})
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low = node.get("minimum", node.get("exclusiveMinimum", -(2**40) - 1) + 1)
        return st.integers(low, node.get("maximum", 2**40))
    if kind == "number":
        low = node.get("minimum", node.get("exclusiveMinimum", -1e12))
        return st.floats(low, node.get("maximum", 1e12), exclude_min="exclusiveMinimum" in node,
                         allow_nan=False, allow_infinity=False)
    if kind == "string":
        if "pattern" in node:  # prometheus_url: ^https?://
            return st.builds(lambda s, rest: s + rest, st.sampled_from(["http://", "https://"]), st.text())
        return st.text(min_size=node.get("minLength", 0), max_size=20)
    if kind == "array":
        return st.lists(_from_schema(node["items"]), min_size=node.get("minItems", 0), max_size=4)
    props = node.get("properties", {})
    required = set(node.get("required", ()))
    return st.fixed_dictionaries({k: _from_schema(v) for k, v in props.items() if k in required},
                                 optional={k: _from_schema(v) for k, v in props.items() if k not in required})


_WEIGHT = st.just(0.0) | st.floats(0.001, 1000, allow_nan=False)
_STAGE = st.fixed_dictionaries({}, optional={t: _WEIGHT for t in StageWeights.model_fields}).filter(
    lambda terms: len(terms) < len(StageWeights.model_fields) or any(terms.values()))


def _valid_settings() -> st.SearchStrategy[dict[str, Any]]:
    schema = Settings.model_json_schema()
    props = {k: _inline(v, schema["$defs"]) for k, v in schema["properties"].items() if k not in FILES}
    props.pop("weights")
    props.pop("feature_gates")
    top = _from_schema({"type": "object", "properties": props})
    weights = st.fixed_dictionaries({}, optional=dict.fromkeys(STAGES, _STAGE))
    gates = st.fixed_dictionaries({}, optional=dict.fromkeys(FEATURE_GATES, st.booleans()))

    def whole(top: dict[str, Any], weights: dict[str, Any], gates: dict[str, bool]) -> dict[str, Any]:
        data = {**top, "weights": weights, "feature_gates": gates}
        ttl, bind = data.get("gang_reservation_ttl_seconds", 120.0), data.get("gang_bind_timeout_seconds", 3.0)
        if ttl <= bind:  # the one rule across settings the schema cannot say
            data.pop("gang_reservation_ttl_seconds", None)
            data.pop("gang_bind_timeout_seconds", None)
        return data

    return st.builds(whole, top, weights, gates)


def _load(text: str) -> Settings:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "c.yaml"
        f.write_text(text, encoding="utf-8")
        return load_settings(f)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_valid_settings())
def test_load_dump_load_gives_equal_settings(data: dict[str, Any]) -> None:
    text = f"apiVersion: {API_VERSION}\nkind: {KIND}\n" + yaml.safe_dump(data, allow_unicode=True)
    first = _load(text)
    dumped = dump_settings(first)
    second = _load(dumped)
    assert second.model_dump() == first.model_dump()
    assert dump_settings(second) == dumped  # and the dump is a fixed point
    kept = _load(dump_settings(first, changed_only=True))  # only what differs from the defaults
    assert kept.model_dump() == first.model_dump()


def test_the_short_dump_holds_only_what_differs_from_the_defaults() -> None:
    s = Settings(port=9000, weights={"pretraining": {"cost": 1.0}}, feature_gates={"FilterToBest": False})
    document = yaml.safe_load(dump_settings(s, changed_only=True))
    # pretraining's cost default is 0.5: 1.0 differs from the stage's default, not StageWeights' own.
    assert document == {"apiVersion": API_VERSION, "kind": KIND, "port": 9000,
                        "weights": {"pretraining": {"cost": 1.0}}, "feature_gates": {"FilterToBest": False}}
    assert yaml.safe_load(dump_settings(Settings(), changed_only=True)) == {"apiVersion": API_VERSION,
                                                                           "kind": KIND}


def test_the_dump_is_versioned_and_names_every_setting() -> None:
    document = yaml.safe_load(dump_settings(Settings()))
    assert list(document)[:2] == ["apiVersion", "kind"]
    assert (document["apiVersion"], document["kind"]) == (API_VERSION, KIND)
    assert set(document) - {"apiVersion", "kind"} == set(Settings.model_fields)


def test_an_unversioned_file_loads_as_the_versioned_one_with_a_warning(tmp_path: Path) -> None:
    body = "port: 9000\nweights:\n  serving: {cost: 7}\n"
    with pytest.warns(ConfigDeprecationWarning, match="has no apiVersion and kind"):
        old = _load(body)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = _load(f"apiVersion: {API_VERSION}\nkind: {KIND}\n" + body)
    assert old.model_dump() == new.model_dump()


GATE_READS = {
    # gate -> what it sets in the policies, on and off
    "WholeNodeGuard": lambda p: p.placement.scoring.whole_node_guard,
    "CrossShapeGuard": lambda p: p.placement.scoring.stranded_idle_share > 0,
    "ScoreRankBands": lambda p: p.placement.scoring.score_mapping is ScoreMapping.RANK,
    "FilterToBest": lambda p: p.placement.filter_to_best,
    "DefaultTargetFilter": lambda p: p.placement.feasibility.default_target_filter,
}


def test_every_gate_has_a_policy_it_switches() -> None:
    assert set(GATE_READS) == set(FEATURE_GATES)


@pytest.mark.parametrize("gate", list(FEATURE_GATES))
def test_each_gate_defaults_by_its_stage_and_switches_its_policy(gate: str) -> None:
    spec = FEATURE_GATES[gate]
    assert spec.default is (spec.stage == "beta")  # alpha off, beta on, as in Kubernetes
    read = GATE_READS[gate]
    assert read(Settings().policies()) is spec.default
    for on in (True, False):
        assert read(Settings(feature_gates={gate: on}).policies()) is on


@pytest.mark.parametrize(("old", "value", "gate", "on"), [
    ("whole_node_guard", False, "WholeNodeGuard", False),
    ("stranded_idle_share", 0.5, "CrossShapeGuard", True),
    ("stranded_idle_share", 0, "CrossShapeGuard", False),
    ("score_mapping", "linear", "ScoreRankBands", False),
    ("score_mapping", ScoreMapping.RANK, "ScoreRankBands", True),
    ("filter_to_best", "off", "FilterToBest", False),
    ("default_target_filter", "false", "DefaultTargetFilter", False),
])
def test_an_old_name_becomes_its_gate_with_a_warning(old: str, value: Any, gate: str, on: bool) -> None:
    assert RENAMED[old].gate == gate
    with pytest.warns(ConfigDeprecationWarning, match=f"{old} is deprecated: set feature_gates.{gate}"):
        s = Settings(**{old: value})
    assert s.gate(gate) is on and GATE_READS[gate](s.policies()) is on
    assert old not in s.model_dump()


def test_a_removed_setting_is_ignored_with_a_warning() -> None:
    with pytest.warns(ConfigDeprecationWarning, match="gil_switch_interval_seconds is no longer read"):
        s = Settings(gil_switch_interval_seconds=0.01)
    assert s.model_dump() == Settings().model_dump()


def test_old_names_in_the_environment_still_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without their own source the environment would drop them silently: a changed behaviour.
    monkeypatch.setenv("LLMP_GANG_HOLD_FOR_OLDEST", "true")
    with pytest.warns(ConfigDeprecationWarning, match="gang_hold_for_oldest"):
        assert Settings().gang_hold_after_seconds == 0


def test_gates_from_the_environment_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMP_FEATURE_GATES__CROSSSHAPEGUARD", "true")
    monkeypatch.setenv("LLMP_FEATURE_GATES__wholenodeguard", "false")
    s = load_settings(None)
    assert s.feature_gates == {"CrossShapeGuard": True, "WholeNodeGuard": False}


def test_a_gate_set_by_name_wins_over_its_old_name() -> None:
    with pytest.warns(ConfigDeprecationWarning):
        s = _load(f"apiVersion: {API_VERSION}\nkind: {KIND}\nwhole_node_guard: true\n"
                  "feature_gates: {WholeNodeGuard: false}\n")
    assert s.gate("WholeNodeGuard") is False


def test_an_unknown_gate_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMP_FEATURE_GATES", '{"NoSuchGate": true}')
    with pytest.raises(Exception, match="NoSuchGate"):
        load_settings(None)
