"""The committed dashboards and rules are exactly what the generator makes, and reference only
metrics the extender exports (names checked here; data checked against a real Prometheus in
test_scrape.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.prometheus.helpers import ROOT, all_queries, generator, metric_attrs, referenced


def test_committed_files_equal_a_fresh_generation() -> None:
    gen = generator()
    drift = [str(p.relative_to(ROOT)) for p, text in gen.outputs() if not p.exists() or p.read_text() != text]
    assert not drift, f"out of date, run `python scripts/gen_dashboards.py`: {drift}"
    assert gen.main(["--check"]) == 0


def test_deploy_and_chart_copies_are_identical_and_complete() -> None:
    gen = generator()
    deploy, chart = gen.DASHBOARD_DIRS
    names = sorted(p.name for p in deploy.glob("*.json"))
    assert names == sorted(f"{b.name}.json" for b in gen.BOARDS)
    assert sorted(p.name for p in chart.glob("*.json")) == names
    for n in names:
        assert (deploy / n).read_bytes() == (chart / n).read_bytes(), n
    rules, chart_rules = gen.RULE_FILES
    assert rules.read_bytes() == chart_rules.read_bytes()
    # The chart's template reads .groups from the file.
    assert [g["name"] for g in yaml.safe_load(chart_rules.read_text())["groups"]] == [
        "llm-placement.records", "llm-placement.alerts"]


def test_every_referenced_metric_is_exported_or_recorded() -> None:
    gen = generator()
    exported = metric_attrs()
    records = {r.record for r in gen.RECORDS}
    unknown = {
        (q.where, name) for q in all_queries() for name in referenced(q.expr)
        if name not in exported and name not in records
    }
    assert not unknown, f"queries read metrics nobody exports: {sorted(unknown)}"
    # The check itself must see something: every query names at least one of our metrics, but for
    # the alert on the extender being down, which must work when none of them exist and reads only
    # Prometheus's own scrape health (`up`).
    without_ours = {q.where for q in all_queries() if not referenced(q.expr)}
    assert without_ours <= {"alert LLMPlacementExtenderDown (signal)",
                            "alert LLMPlacementExtenderDown"}, without_ours
    assert all("up{" in q.expr for q in all_queries() if q.where in without_ours)


def test_dashboards_are_well_formed() -> None:
    gen = generator()
    uids = set()
    for board in gen.BOARDS:
        path: Path = gen.DASHBOARD_DIRS[0] / f"{board.name}.json"
        d = json.loads(path.read_text())
        uids.add(d["uid"])
        assert "llm-placement" in d["tags"]
        assert [v["name"] for v in d["templating"]["list"]] == ["datasource"]
        panels = d["panels"]
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)) and 0 not in ids, f"{board.name}: panel ids {ids}"
        for p in panels:
            if p["type"] == "row":
                continue
            assert p["description"], f"{board.name}/{p['title']}: panels explain themselves"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["targets"], f"{board.name}/{p['title']} has no query"
            for t in p["targets"]:
                assert t["datasource"] == p["datasource"] and t["refId"]
    assert len(uids) == len(gen.BOARDS)
