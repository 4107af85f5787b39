"""DeviceTaintRules: which devices of the driver they keep new claims off, and so which nodes' free
GPUs they change (docs/dra.md, "Taints"). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.dra.devices import as_dict, keeps_off
from app.dra.slices import SliceStore

# (driver, pool, device) a rule taints, None meaning any.
Rule = tuple[str | None, str | None, str | None]


def taint_rule(obj: dict[str, Any]) -> Rule | None:
    """(driver, pool, device) a DeviceTaintRule taints, None meaning any; None when the rule keeps
    no claim off (informational effect, or no selector: "without a selector, no devices")."""
    spec = as_dict(obj.get("spec")) if isinstance(obj, dict) else {}
    sel = spec.get("deviceSelector")
    if not isinstance(sel, dict) or not keeps_off(spec.get("taint")):
        return None

    def one(key: str) -> str | None:
        v = sel.get(key)
        return v if isinstance(v, str) and v else None

    return one("driver"), one("pool"), one("device")


@dataclass(slots=True)
class TaintRules:
    """The DeviceTaintRules that keep claims off devices, by rule name; ``store`` places pools on
    nodes and names the driver."""

    store: SliceStore
    rules: dict[str, Rule] = field(default_factory=dict)

    def put(self, obj: dict[str, Any]) -> set[str]:
        """Add or replace a DeviceTaintRule; returns the nodes whose devices it may concern."""
        name = str(as_dict(obj.get("metadata")).get("name") or "")
        old = self.rules.pop(name, None)
        rule = taint_rule(obj)
        if rule is not None:
            self.rules[name] = rule
        return self._nodes(old) | self._nodes(rule)

    def drop(self, name: str) -> set[str]:
        return self._nodes(self.rules.pop(name, None))

    def clear(self) -> set[str]:
        nodes = set().union(*(self._nodes(r) for r in self.rules.values()))
        self.rules.clear()
        return nodes

    def covers(self, pool: str, device: str) -> bool:
        driver = self.store.driver
        return any((drv is None or drv == driver) and (p is None or p == pool)
                   and (dev is None or dev == device) for drv, p, dev in self.rules.values())

    def _nodes(self, rule: Rule | None) -> set[str]:
        pool_node = self.store.pool_node
        if rule is None or (rule[0] is not None and rule[0] != self.store.driver):
            return set()
        if rule[1] is not None:
            return {pool_node[rule[1]]} if rule[1] in pool_node else set()
        return set(pool_node.values())
