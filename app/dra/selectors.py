"""The restrictions DRA selectors put on devices, as far as we read them (docs/dra.md, "What is read
from selectors"): a request's or DeviceClass's CEL expressions become a ``Selection`` (driver, type,
products, MIG profiles, memory, predicates on other attributes). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from app.base.units import parse_quantity
from app.dra.cel_bool import And, Atom, Node, Not, Or, atoms, conjuncts, parse, possible
from app.dra.devices import DRIVER, DraDevice

# --- the simple CEL forms we read (docs/dra.md, "What is read from selectors") --------------------
# Not a CEL engine: an expression is parsed into its logical structure (``cel_bool``), and each part
# joined by a top-level ``&&`` either matches one of these forms or is left to kube-scheduler's
# DynamicResources plugin (which evaluates every selector anyway). ``a && b`` accepts no device ``a``
# refuses, so reading only some conjuncts can widen the set of nodes we accept, never narrow it.
_Q = r"""["']([^"'\\]*)["']"""
_ATTR = r"""device\.attributes\[\s*["']([^"']+)["']\s*\]\.(\w+)"""
_CAP = r"""device\.capacity\[\s*["']([^"']+)["']\s*\]\.(\w+)"""
_EQ = re.compile(rf"^{_ATTR}\s*==\s*{_Q}$")
_IN = re.compile(rf"^{_ATTR}\s+in\s*\[([^\]]*)\]$")
_STARTS = re.compile(rf"^{_ATTR}\.startsWith\(\s*{_Q}\s*\)$")
_MATCHES = re.compile(rf"^{_ATTR}\.matches\(\s*{_Q}\s*\)$")
_CMP = re.compile(rf"^{_CAP}\.compareTo\(\s*quantity\(\s*{_Q}\s*\)\s*\)\s*(>=|>|==|<=|<)\s*0$")
_VCMP = re.compile(rf"^{_ATTR}\.compareTo\(\s*semver\(\s*{_Q}\s*\)\s*\)\s*(>=|>|==|<=|<)\s*0$")
_LIT = re.compile(rf"^{_ATTR}\s*==\s*(true|false|-?\d+)$")
# Attribute domains a device's attributes and capacities are named in: the driver's own, and the
# standard one (resource.kubernetes.io/pciBusID, pcieRoot).
STANDARD_DOMAIN = "resource.kubernetes.io"
_DRV = re.compile(rf"^device\.driver\s*==\s*{_Q}$")
_LIST_ITEM = re.compile(_Q)
MAX_EXPR = 4096  # longer expressions are not read (kube-scheduler still evaluates them)
MAX_VALUES = 64  # values of one ``in`` list
MAX_PREDICATES = 16  # productName predicates kept per pod (dropping one only widens the set)


@dataclass(frozen=True, slots=True)
class Selection:
    """What the recognised selectors of a class or request say about the devices they accept."""

    driver: str | None = None
    kind: str | None = None  # "gpu" or "mig" (attribute ``type``)
    # productName predicates, all of which must hold: ("in", names) / ("prefix", p) / ("re", rx)
    products: tuple[tuple[str, tuple[str, ...]], ...] = ()
    profiles: tuple[str, ...] | None = None  # MIG profiles allowed (None: any)
    min_memory_mib: float = 0.0
    unread: tuple[str, ...] = ()  # conjuncts left to kube-scheduler (for explain)
    # Predicates on other attributes and capacities (DevicePredicate), all of which must hold on one
    # device; DraIndex turns them into the products (or MIG profiles) that have such a device.
    device: tuple[DevicePredicate, ...] = ()

    def merge(self, other: Selection) -> Selection:
        profiles = self.profiles if other.profiles is None else other.profiles if self.profiles is None \
            else tuple(p for p in self.profiles if p in other.profiles)
        return Selection(driver=other.driver or self.driver, kind=other.kind or self.kind,
                         products=self.products + other.products, profiles=profiles,
                         min_memory_mib=max(self.min_memory_mib, other.min_memory_mib),
                         unread=self.unread + other.unread, device=self.device + other.device)


# (what, domain, name, op, values): what is "attr" (string, bool or int attribute: op in, prefix or
# re), "ver" (a version attribute compared with semver) or "cap" (a capacity compared with quantity:
# op >=, >, ==, <=, <).
DevicePredicate = tuple[str, str, str, str, tuple[str, ...]]


def _short(expr: str, limit: int = 80) -> str:
    expr = " ".join(expr.split())
    return expr if len(expr) <= limit else expr[: limit - 3] + "..."


def _expressions(selectors: Any) -> list[str]:
    out = []
    for sel in selectors if isinstance(selectors, list) else []:
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if isinstance(expr, str):
            out.append(expr)
    return out


def read_selectors(selectors: Any, driver: str = DRIVER) -> Selection:
    """The restrictions of a list of ``{cel: {expression}}`` selectors we can read (docs/dra.md)."""
    out = Selection()
    for expr in _expressions(selectors):
        out = out.merge(read_expression(expr, driver))
    return out


@lru_cache(maxsize=4096)  # a Selection is immutable; the same selectors come back every filter call
def read_expression(expr: str, driver: str = DRIVER) -> Selection:
    """What one CEL expression restricts: each top-level conjunct of a form we know, plus the
    driver and device type wherever the whole expression pins them to one value (``!(type !=
    "mig")`` is a MIG selector, ``type == "mig" || type == "gpu"`` and ``!(type == "mig")`` pin
    nothing). A part we do not read restricts nothing and is named in ``unread``."""
    tree = parse(expr) if len(expr) <= MAX_EXPR else None
    if tree is None:
        return Selection(unread=(_short(expr),))
    out = Selection()
    for part in conjuncts(tree):
        got = _read_one(part.text, driver) if isinstance(part, Atom) \
            else Selection(unread=(_short(_text(part)),))
        # The device type is decided on the whole expression below, never by one part alone.
        out = out.merge(replace(got, kind=None))
    kind = _pinned(tree, "type", driver)
    return replace(out, kind=kind.lower() if kind else None,
                   driver=_pinned(tree, "driver", driver) or out.driver)


def _text(node: Node) -> str:
    if isinstance(node, Atom):
        return node.text
    if isinstance(node, Not):
        return f"!({_text(node.arg)})"
    joint = " && " if isinstance(node, And) else " || "
    return joint.join(f"({_text(a)})" if isinstance(a, And | Or) else _text(a) for a in node.args)


# Atoms that say which value the driver or the device type has: ``device.driver == "x"``,
# ``....type != "x"``, ``....type in ["x", "y"]``.
_DRV_CMP = re.compile(rf"^device\.driver\s*(==|!=)\s*{_Q}$")
_ATTR_CMP = re.compile(rf"^{_ATTR}\s*(==|!=)\s*{_Q}$")
_OTHER = "\x00other"  # a value no selector names


def _value_test(text: str, key: str, driver: str) -> tuple[str, tuple[str, ...]] | None:
    """(op, values) when atom ``text`` tests ``key`` ("driver", or "type" in the driver's domain)."""
    if key == "driver":
        m = _DRV_CMP.match(text)
        return (m.group(1), (m.group(2),)) if m else None
    if (m := _ATTR_CMP.match(text)) is not None:
        domain, name, op, value = m.groups()
        return (op, (value,)) if (domain, name) == (driver, key) else None
    if (m := _IN.match(text)) is not None:
        domain, name, raw = m.groups()
        values = tuple(_LIST_ITEM.findall(raw))
        return ("in", values) if (domain, name) == (driver, key) and len(values) <= MAX_VALUES else None
    return None


def _pinned(tree: Node, key: str, driver: str) -> str | None:
    """The one value of ``key`` a device can have and still be accepted by ``tree`` (Kleene's logic:
    the atoms on other things unknown), or None when none or several can."""
    tests = {t: got for t in dict.fromkeys(atoms(tree)) if (got := _value_test(t, key, driver))}
    if not tests:
        return None
    candidates = {v for _, values in tests.values() for v in values} | {_OTHER}
    fits = []
    for value in sorted(candidates):
        truth: dict[str, bool | None] = {
            t: (value in values) == (op != "!=") for t, (op, values) in tests.items()}
        if possible(tree, truth) is not False:
            fits.append(value)
    return fits[0] if len(fits) == 1 and fits[0] != _OTHER else None


def _read_one(part: str, driver: str) -> Selection:
    unread = Selection(unread=(_short(part),))
    if (m := _DRV.match(part)) is not None:
        return Selection(driver=m.group(1))
    if (m := _CMP.match(part)) is not None:
        return _read_capacity(m.groups(), driver) or unread
    if (m := _VCMP.match(part)) is not None:
        domain, name, raw, op = m.groups()
        if domain not in (driver, STANDARD_DOMAIN) or _semver(raw) is None:
            return unread
        return Selection(device=(("ver", domain, name, op, (raw,)),))
    if (m := _LIT.match(part)) is not None:
        domain, name, raw = m.groups()
        return Selection(device=(("attr", domain, name, "in", (raw,)),)) \
            if domain in (driver, STANDARD_DOMAIN) else unread
    for rx, how in ((_EQ, "in"), (_IN, "in"), (_STARTS, "prefix"), (_MATCHES, "re")):
        if (m := rx.match(part)) is None:
            continue
        domain, name, raw = m.groups()
        if domain not in (driver, STANDARD_DOMAIN):
            return unread
        values = tuple(_LIST_ITEM.findall(raw)) if rx is _IN else (raw,)
        if len(values) > MAX_VALUES:
            return unread  # dropping values would narrow the set: leave it to kube-scheduler
        if how == "re" and not _simple_regex(raw):
            return unread
        if domain != driver:
            return Selection(device=(("attr", domain, name, how, values),))
        if name == "productName":
            return Selection(products=((how, values),))
        if name == "profile" and how == "in":
            return Selection(profiles=values)
        if name == "type" and how == "in" and len(values) == 1:
            return Selection(kind=values[0].lower())
        if name == "type":
            return unread
        return Selection(device=(("attr", domain, name, how, values),))
    return unread


def _read_capacity(groups: tuple[str, ...], driver: str) -> Selection | None:
    """``device.capacity[...].X.compareTo(quantity(...)) op 0``: at least some memory is a node fact
    of its own; any other bound is a device predicate."""
    domain, name, raw, op = groups
    if domain not in (driver, STANDARD_DOMAIN):
        return None
    try:
        amount = parse_quantity(raw)
    except ValueError:
        return None
    if domain == driver and name == "memory" and op in (">=", ">", "=="):
        # Exactly X: at least X here (the device predicate below checks the rest).
        mib = amount / 2**20 + (1e-6 if op == ">" else 0.0)
        exact = (("cap", domain, name, op, (raw,)),) if op == "==" else ()
        return Selection(min_memory_mib=mib, device=exact)
    return Selection(device=(("cap", domain, name, op, (raw,)),))


def _semver(raw: str) -> tuple[int, ...] | None:
    """major.minor.patch of a CEL semver (pre-release and build metadata ignored)."""
    core = raw.strip().lstrip("v").split("-", 1)[0].split("+", 1)[0].split(".")
    if not 1 <= len(core) <= 3 or not all(p.isdigit() for p in core):
        return None
    return tuple(int(p) for p in core) + (0,) * (3 - len(core))


_OPS = {">=": lambda c: c >= 0, ">": lambda c: c > 0, "==": lambda c: c == 0,
        "<=": lambda c: c <= 0, "<": lambda c: c < 0}


def _cmp(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def device_satisfies(d: DraDevice, preds: tuple[DevicePredicate, ...], driver: str = DRIVER) -> bool:
    """Do all ``preds`` hold for ``d`` (an absent attribute or capacity fails, as in CEL)?"""
    values = {(dom or driver, name): v for dom, name, v in d.values}
    caps = {(dom or driver, name): v for dom, name, v in d.capacities}
    for what, dom, name, op, args in preds:
        if what == "cap":
            have = caps.get((dom, name))
            try:
                if have is None or not _OPS[op](_cmp(have, parse_quantity(args[0]))):
                    return False
            except ValueError:
                return False
            continue
        got = values.get((dom, name))
        if got is None:
            return False
        if what == "ver":
            mine, theirs = _semver(got), _semver(args[0])
            if mine is None or theirs is None or not _OPS[op](_cmp(mine, theirs)):
                return False
        elif not product_matches(((op, args),), got):
            return False
    return True


_QUANTIFIED_GROUP = re.compile(r"\)[*+?{]")
MAX_REGEX = 128


def _simple_regex(pattern: str) -> bool:
    """A ``matches`` pattern we evaluate ourselves: short, compilable, no quantified group and at most
    three quantifiers, so Python's backtracking stays polynomial on a product name (a tenant's
    selector must not cost a filter call seconds). Anything else is left to kube-scheduler (RE2)."""
    if len(pattern) > MAX_REGEX or _QUANTIFIED_GROUP.search(pattern) is not None:
        return False
    if sum(pattern.count(c) for c in "*+?{") > 3:
        return False
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def product_matches(predicates: tuple[tuple[str, tuple[str, ...]], ...], product: str | None) -> bool:
    """Does ``product`` (a device's productName) satisfy every recognised productName predicate?"""
    if not predicates:
        return True
    if product is None:
        return False
    for how, values in predicates:
        if how == "in" and product not in values:
            return False
        if how == "prefix" and not product.startswith(values[0]):
            return False
        if how == "re" and re.search(values[0], product) is None:  # CEL matches: RE2, unanchored
            return False
    return True


def class_driver(device_class: dict[str, Any]) -> tuple[str | None, bool]:
    """(driver named by the class's CEL selectors, whether it selects MIG slices)."""
    sel = class_selection(device_class)
    return sel.driver, sel.kind == "mig"


def class_selection(device_class: dict[str, Any]) -> Selection:
    """What a DeviceClass's selectors restrict: driver, device type, product, memory, profile. The
    class is the driver's only where its selectors pin the driver (a top-level ``device.driver ==``
    part, or an expression that accepts no other driver)."""
    spec = device_class.get("spec") if isinstance(device_class, dict) else None
    sels = spec.get("selectors") if isinstance(spec, dict) else None
    driver = None
    for expr in _expressions(sels):
        driver = _expression_driver(expr) or driver
    return replace(read_selectors(sels, driver or DRIVER), driver=driver)


@lru_cache(maxsize=4096)
def _expression_driver(expr: str) -> str | None:
    tree = parse(expr) if len(expr) <= MAX_EXPR else None
    return _pinned(tree, "driver", DRIVER) if tree is not None else None


def devices_of(sel: Selection) -> str | None:
    """What a class (or request) of the driver hands out: "mig" slices, "gpu" (whole GPUs), or
    None for devices that are no container GPU (a ``vfio`` passthrough GPU, a type we do not know).
    A profile selector on a class naming no type asks for MIG slices (only those carry a profile)."""
    if sel.kind == "mig" or (sel.kind is None and sel.profiles is not None):
        return "mig"
    return "gpu" if sel.kind in (None, "gpu") else None
