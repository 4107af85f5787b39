"""The settings' reference page and the chart's schema, both generated from ``app.config.settings.Settings``.

Each setting is described once, in its field's docstring; docs/configuration.md and the
``extender.settings`` part of helm/llm-placement/values.schema.json are written from the model
(``python -m scripts.gen_config_docs``), and tests fail when either committed file is stale.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from app import __version__
from app.config.settings import (
    API_VERSION,
    FEATURE_GATES,
    KIND,
    RENAMED,
    STAGES,
    UNVERSIONED_UNTIL,
    LiveProfileSettings,
    NodeLabelKeys,
    Renamed,
    Settings,
    StageWeights,
    TierBandwidth,
    _default_weights,
    _renamed_message,
)

# Settings the chart writes itself from structured values (helm/llm-placement/templates/_helpers.tpl):
# not settable under extender.settings, so not in its schema.
CHART_MANAGED = ("host", "port", "metrics_host", "metrics_port", "url_prefix", "scheduler_name", "log_level",
                 "tls_cert_file", "tls_key_file", "tls_client_ca_file")
# Fields that are a mapping or section of their own, documented in their own table.
SECTIONS: dict[str, type[BaseModel]] = {
    "labels": NodeLabelKeys, "tier_bandwidth_gbps": TierBandwidth, "live_profiles": LiveProfileSettings,
}


def _text(description: str | None) -> str:
    return " ".join((description or "").split())


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Pydantic's JSON schema without $ref, titles or defaults, and ``X or null`` as one node: the form
    a values.schema.json embeds (its $refs would resolve against the chart's root, not the model's)."""
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {**target, **_inline({k: v for k, v in node.items() if k != "$ref"}, defs)}
    out = {k: _inline(v, defs) for k, v in node.items() if k not in ("title", "default")}
    if "description" in out:
        out["description"] = _text(out["description"])
    options = out.pop("anyOf", None)
    if options is not None:
        kinds = [o for o in options if o != {"type": "null"}]
        if len(kinds) == 1 and len(options) == 2 and "type" in kinds[0]:
            out = {**kinds[0], **out, "type": [kinds[0]["type"], "null"]}
        else:
            out["anyOf"] = options
    return out


def helm_settings_schema() -> dict[str, Any]:
    """The JSON schema of the chart's ``extender.settings``: every setting but those the chart sets
    itself, the old names of RENAMED (accepted, marked deprecated), unknown keys refused."""
    schema = Settings.model_json_schema()
    defs = schema.get("$defs", {})
    props: dict[str, Any] = {}
    for name, node in schema["properties"].items():
        if name not in CHART_MANAGED:
            props[name] = _inline(node, defs)
    stage = _inline(StageWeights.model_json_schema(), {})
    stage.pop("description", None)
    props["weights"] = {"type": "object", "additionalProperties": False,
                        "description": props["weights"]["description"],
                        "properties": {s: stage for s in STAGES}}
    props["feature_gates"] = {
        "type": "object", "additionalProperties": False, "description": props["feature_gates"]["description"],
        "properties": {name: {"type": "boolean", "description": _gate_line(name)} for name in FEATURE_GATES}}
    for old, rule in RENAMED.items():
        props[old] = {**rule.schema, "deprecated": True, "description": _renamed_message(old, rule)}
    return {
        "type": "object", "additionalProperties": False,
        "description": "Extender settings (docs/configuration.md) other than those the chart sets itself "
                       f"(apiVersion, kind, {', '.join(CHART_MANAGED)}).",
        "properties": props,
    }


def _gate_line(name: str) -> str:
    gate = FEATURE_GATES[name]
    return f"{gate.stage}, default {str(gate.default).lower()}, goes in {gate.until}: {gate.doc}"



def _read_as(rule: Renamed) -> str:
    if rule.setting:
        return f"`{rule.setting}`"
    return f"`feature_gates.{rule.gate}`" if rule.gate else "ignored"

def _num(x: float) -> str:
    """A bound or default as written in a file: ints whole, floats as short as they stay exact."""
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}".replace(",", "_") if abs(x) >= 100_000 else str(int(x))
    return f"{x:g}" if float(f"{x:g}") == x else repr(x)


def _value(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, tuple | list) and all(isinstance(x, str) for x in v):
        return ", ".join(f"`{x}`" for x in v)
    if isinstance(v, tuple | list | dict):
        return f"`{json.dumps(v)}`"
    return f"`{_num(v)}`" if isinstance(v, int | float) else f"`{v}`"


def _kind(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " or ".join(f"`{e}`" for e in node["enum"])
    kind = node.get("type", "object")
    if isinstance(kind, list):
        return " or ".join(k if k != "null" else "none" for k in kind)
    if kind == "array":
        return f"list of {_kind(node.get('items', {}))}"
    return str(kind)


def _range(node: dict[str, Any]) -> str:
    bounds = [(">=", "minimum"), (">", "exclusiveMinimum"), ("<=", "maximum"), ("<", "exclusiveMaximum")]
    parts = [f"{op} {_num(node[key])}" for op, key in bounds if key in node]
    if "minItems" in node:
        parts.append(f"at least {node['minItems']}")
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    return ", ".join(parts)


def _table(model: type[BaseModel], prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    rows = ["| setting | type | default | range | what it sets |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        node = _inline(schema["properties"][name], defs)
        if name in SECTIONS:
            kind, default = "section", f"[below](#{name})"
        elif name in ("weights", "feature_gates"):
            kind, default = "mapping", f"[below](#{name.replace('_', '-')})"
        elif field.is_required():
            kind, default = _kind(node), "required"
        else:
            kind, default = _kind(node), _value(field.get_default(call_default_factory=True))
        what = _text(field.description)
        rows.append(f"| `{prefix}{name}` | {kind} | {default} | {_range(node)} | {what} |")
    return rows


def _weights() -> list[str]:
    defaults = _default_weights()
    terms = list(StageWeights.model_fields)
    rows = ["| term | " + " | ".join(STAGES) + " | what it rewards |",
            "|---|" + "---:|" * len(STAGES) + "---|"]
    for term in terms:
        cells = " | ".join(f"{getattr(defaults[s], term):g}" for s in STAGES)
        rows.append(f"| `{term}` | {cells} | {_text(StageWeights.model_fields[term].description)} |")
    return rows


def count_settings() -> tuple[int, int, int]:
    """(top-level settings, leaves, feature gates): a section's fields count as leaves, ``weights``
    as one leaf (its 45 stage weights are counted apart), ``feature_gates`` as one per gate."""
    top = len(Settings.model_fields)
    leaves = sum(len(SECTIONS[n].model_fields) if n in SECTIONS else 1 for n in Settings.model_fields)
    return top, leaves - 1 + len(FEATURE_GATES), len(FEATURE_GATES)


def markdown() -> str:
    """docs/configuration.md."""
    top, leaves, gates = count_settings()
    lines = [
        "# Configuration",
        "",
        "<!-- GENERATED by `python -m scripts.gen_config_docs` from the field docstrings of",
        "app/config/settings.py and app/config/policy.py: edit those, not this page",
        "(tests/unit/config/test_config_docs.py fails when it is stale). -->",
        "",
        "The extender reads one YAML file (`llm-placement serve --config FILE`, or `LLMP_CONFIG`), then",
        "`LLMP_*` environment variables, which override it (nested keys joined with `__`:",
        "`LLMP_WEIGHTS__SERVING__COST=3`, `LLMP_FEATURE_GATES__GANGHOLDFOROLDEST=true`). Every setting is",
        "optional. The file is versioned, as kube-scheduler's `KubeSchedulerConfiguration`",
        "(`kubescheduler.config.k8s.io/v1`) and Kueue's `Configuration` (`config.kueue.x-k8s.io`,",
        "https://kueue.sigs.k8s.io/docs/reference/kueue-config.v1beta2/) are:",
        "",
        "```yaml",
        f"apiVersion: {API_VERSION}",
        f"kind: {KIND}",
        "weights:",
        "  serving: {cost: 3}        # one term of one stage; the stage's other terms keep their defaults",
        "feature_gates:",
        "  CrossShapeGuard: true",
        "```",
        "",
        f"A file without `apiVersion` and `kind` is read as `{API_VERSION}` with a warning until "
        f"{UNVERSIONED_UNTIL};",
        "another version or kind is refused. `llm-placement config validate FILE` reads a file exactly as",
        "`serve --config FILE` does (`LLMP_*` variables included) and prints one line per bad field with",
        "its path (`weights.serving.cost: must be >= 0`, `labels.bogus: unknown key`), exit status 2, or",
        "`FILE: OK`; deprecated forms are warned about on standard error. `llm-placement config dump",
        "FILE` prints the file in the current form (old names and a missing version rewritten; only what",
        "differs from the defaults, or every setting with `--all`). Unknown keys are refused everywhere.",
        "The Helm chart writes this file from `extender.settings` (its `values.schema.json`",
        "is generated from the same model) and sets the listen addresses, `url_prefix`, `scheduler_name`,",
        "`log_level` and the TLS files itself.",
        "",
        f"This build ({__version__}) has {top} top-level settings, {leaves} in all counting each field of a",
        f"section and each of the {gates} feature gates once (and `weights` once: 5 stages x 9 terms).",
        "",
        "## Settings",
        "",
        *_table(Settings, ""),
        "",
    ]
    for name, model in SECTIONS.items():
        lines += [f"### {name}", "", _text(Settings.model_fields[name].description), "",
                  *_table(model, f"{name}."), ""]
    lines += [
        "### weights", "",
        _text(Settings.model_fields["weights"].description) + " Each stage's terms form a weighted mean,"
        " so only ratios within a stage matter; a weight is 0 (term off) or 0.001 to 1000, and a stage"
        " keeps at least one term above 0. Defaults:", "",
        *_weights(), "",
        "## Feature gates", "",
        _text(Settings.model_fields["feature_gates"].description) + " As in Kubernetes (\"Feature gates\","
        " https://kubernetes.io/docs/reference/command-line-tools-reference/feature-gates/), alpha gates"
        " are off and beta gates on by default; in the version a gate goes, the gate is removed together"
        " with the code path it switches off (a beta gate's behaviour stays, an alpha gate's is promoted"
        " or removed).", "",
        "| gate | stage | default | goes in | what it switches |", "|---|---|---|---|---|",
        *(f"| `{name}` | {g.stage} | {str(g.default).lower()} | {g.until} | {g.doc} |"
          for name, g in FEATURE_GATES.items()),
        "",
        "## Old names", "",
        f"Still read, with a warning, until {UNVERSIONED_UNTIL}, in the file and as `LLMP_*` variables"
        " (a gate set under `feature_gates` wins over its old name):", "",
        "| old name | read as | until |", "|---|---|---|",
        *(f"| `{old}` | {_read_as(r)}{f' ({r.note})' if r.note else ''} | {UNVERSIONED_UNTIL} |"
          for old, r in RENAMED.items()),
        "",
    ]
    return "\n".join(lines)
