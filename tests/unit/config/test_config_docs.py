"""Every setting is described once, in the model (its field docstring), and the files written from it
are current: docs/configuration.md and the chart's extender.settings schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from app.config.docs import CHART_MANAGED, SECTIONS, helm_settings_schema, markdown
from app.config.policy import NodeLabelKeys, StageWeights, TierBandwidth
from app.config.settings import FEATURE_GATES, RENAMED, LiveProfileSettings, Settings
from scripts.gen_config_docs import CHART_SCHEMA, DOCS, generated

MODELS: tuple[type[BaseModel], ...] = (Settings, NodeLabelKeys, TierBandwidth, LiveProfileSettings, StageWeights)


@pytest.mark.parametrize("path", [DOCS, CHART_SCHEMA], ids=lambda p: p.name)
def test_the_committed_file_is_what_the_model_generates(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == generated()[path], (
        f"{path.name} is stale: run python -m scripts.gen_config_docs")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_has_a_description(model: type[BaseModel]) -> None:
    missing = [name for name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert not missing, f"{model.__name__}: add a docstring under {missing}"


def test_the_page_names_every_setting_gate_and_old_name_once() -> None:
    page = markdown()
    names = [f"`{n}`" for n in Settings.model_fields]
    names += [f"`{s}.{n}`" for s, model in SECTIONS.items() for n in model.model_fields]
    names += [f"`{t}`" for t in StageWeights.model_fields]
    names += [f"`{g}`" for g in FEATURE_GATES] + [f"`{old}`" for old in RENAMED]
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    for name in names:
        assert sum(row.startswith(f"| {name} |") for row in rows) == 1, name


def test_each_gate_row_states_its_stage_default_and_version() -> None:
    page = markdown()
    for name, gate in FEATURE_GATES.items():
        assert f"| `{name}` | {gate.stage} | {str(gate.default).lower()} | {gate.until} |" in page


def test_the_chart_schema_is_the_model_less_what_the_chart_sets() -> None:
    props = helm_settings_schema()["properties"]
    assert set(props) == (set(Settings.model_fields) - set(CHART_MANAGED)) | set(RENAMED)
    assert all(props[old].get("deprecated") is True for old in RENAMED)
    assert set(props["feature_gates"]["properties"]) == set(FEATURE_GATES)
    assert props["feature_gates"]["additionalProperties"] is False
    # The bounds are the model's, e.g. the headroom's and a nested one's.
    assert props["memory_headroom"]["maximum"] == 0.5
    assert props["live_profiles"]["properties"]["steady_tolerance"]["exclusiveMinimum"] == 0
    assert props["live_profiles"]["type"] == ["object", "null"]
    committed = json.loads(CHART_SCHEMA.read_text())["properties"]["extender"]["properties"]["settings"]
    assert committed == helm_settings_schema()
