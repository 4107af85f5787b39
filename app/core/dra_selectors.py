"""The restrictions DRA selectors put on devices, as far as we read them (docs/dra.md, "What is read
from selectors"): a request's or DeviceClass's CEL expressions become a ``Selection`` (driver, type,
products, MIG profiles, memory, predicates on other attributes). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.core.dra_devices import DRIVER, DraDevice
from app.core.units import parse_quantity

# ``device.driver == "gpu.nvidia.com"`` (either quote) inside a DeviceClass selector.
_DRIVER_RE = re.compile(r"""device\.driver\s*==\s*["']([^"']+)["']""")
# ``device.attributes["gpu.nvidia.com"].type == "mig"``: the class hands out MIG slices.
_TYPE_RE = re.compile(r"""\.type\s*==\s*["'](\w+)["']""")

# --- the simple CEL forms we read (docs/dra.md, "What is read from selectors") --------------------
# Not a CEL engine: an expression is split at top-level ``&&`` and each part either matches one of
# these forms or is left to kube-scheduler's DynamicResources plugin (which evaluates every selector
# anyway); ignoring a conjunct can only widen the set of nodes we accept, never narrow it wrongly.
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
MAX_PARENS = 4  # redundant parentheses dropped around one part
MAX_VALUES = 64  # values of one ``in`` list
MAX_PREDICATES = 16  # productName predicates kept per pod (dropping one only widens the set)


def _conjuncts(expr: str) -> list[str] | None:
    """``a && b && c`` split at the top level; None when the expression has a top-level ``||``
    or ``!`` (a disjunction or negation cannot be read as a list of restrictions)."""
    parts: list[str] = []
    depth, quote_ch, start, i = 0, "", 0, 0
    while i < len(expr):
        c = expr[i]
        if quote_ch:
            if c == "\\":
                i += 1
            elif c == quote_ch:
                quote_ch = ""
        elif c in "\"'":
            quote_ch = c
        elif c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and expr.startswith("&&", i):
            parts.append(expr[start:i])
            start, i = i + 2, i + 2
            continue
        elif depth == 0 and (expr.startswith("||", i) or (c == "!" and not expr.startswith("!=", i))):
            return None
        i += 1
    parts.append(expr[start:])
    out = []
    for p in parts:
        p = p.strip()
        for _ in range(MAX_PARENS):  # bounded: a hostile expression must not cost quadratic time
            if not (p.startswith("(") and p.endswith(")") and _balanced(p[1:-1])):
                break
            p = p[1:-1].strip()
        out.append(p)
    return out


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += c == "("
        depth -= c == ")"
        if depth < 0:
            return False
    return depth == 0


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


def read_selectors(selectors: Any, driver: str = DRIVER) -> Selection:
    """The restrictions of a list of ``{cel: {expression}}`` selectors we can read (docs/dra.md)."""
    out = Selection()
    for sel in selectors if isinstance(selectors, list) else []:
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if not isinstance(expr, str):
            continue
        parts = _conjuncts(expr) if len(expr) <= MAX_EXPR else None
        if parts is None:
            out = out.merge(Selection(unread=(_short(expr),)))
            continue
        for part in parts:
            out = out.merge(_read_one(part, driver))
    return out


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
    """What a DeviceClass's selectors restrict: driver, device type, product, memory, profile."""
    spec = device_class.get("spec") if isinstance(device_class, dict) else None
    sels = spec.get("selectors") if isinstance(spec, dict) else None
    driver, mig = None, False
    for sel in sels if isinstance(sels, list) else []:
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if not isinstance(expr, str):
            continue
        # Searched anywhere (not only as a top-level conjunct): a class is trusted for what it names.
        if (m := _DRIVER_RE.search(expr)) is not None:
            driver = m.group(1)
        if (t := _TYPE_RE.search(expr)) is not None and t.group(1).lower() == "mig":
            mig = True
    read = read_selectors(sels, driver or DRIVER)
    return Selection(driver=driver, kind="mig" if mig else read.kind, products=read.products,
                     profiles=read.profiles, min_memory_mib=read.min_memory_mib, device=read.device)


def devices_of(sel: Selection) -> str | None:
    """What a class (or request) of the driver hands out: "mig" slices, "gpu" (whole GPUs), or
    None for devices that are no container GPU (a ``vfio`` passthrough GPU, a type we do not know).
    A profile selector on a class naming no type asks for MIG slices (only those carry a profile)."""
    if sel.kind == "mig" or (sel.kind is None and sel.profiles is not None):
        return "mig"
    return "gpu" if sel.kind in (None, "gpu") else None
