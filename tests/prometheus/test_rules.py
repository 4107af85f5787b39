"""promtool: the rule files load, and the alerts fire (and stay quiet) where their unit tests say."""

from __future__ import annotations

import subprocess

import pytest

from tests.prometheus.helpers import CHART_RULES, RULES, RULES_TEST, need_binary

pytestmark = pytest.mark.prometheus


@pytest.mark.parametrize("path", [RULES, CHART_RULES], ids=["deploy", "chart"])
def test_promtool_check_rules(path: object) -> None:
    promtool = need_binary("promtool")
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_rule_unit_tests() -> None:
    promtool = need_binary("promtool")
    res = subprocess.run([promtool, "test", "rules", str(RULES_TEST)], capture_output=True, text=True,
                         timeout=120, cwd=RULES_TEST.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
