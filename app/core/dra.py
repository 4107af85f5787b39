"""GPUs through Dynamic Resource Allocation (resource.k8s.io/v1): node facts and pod demand.

Pure: the cluster adapter (``app.cluster.dra``) feeds ``DraIndex`` from watches of ResourceSlices,
ResourceClaims, ResourceClaimTemplates and DeviceClasses; node facts and workload parsing read it.

Node facts are not computed a second way: ``overlay`` rewrites a Node dict so that the GPUs its
slices publish appear where GPU Feature Discovery would put them (product and memory labels, the GPU
count as allocatable ``nvidia.com/gpu``), and ``facts_for`` does the rest exactly as for GFD nodes.
Precedence on a node that has both: the slices win (docs/dra.md).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.policy import NodeLabelKeys
from app.core.units import parse_quantity

DRIVER = "gpu.nvidia.com"
# Safety bounds: a claim asks for at most this many devices per request in our accounting.
MAX_DEVICES = 1024
# Devices one node may publish across all its slices. A node of 8 GPUs with every MIG placement
# published (DynamicMIG) carries about 160; past this the node's DRA GPUs are not read at all, said
# in the log and counted (docs/dra.md, "Churn"): recomputing a node's facts walks every device, and
# 100,000 devices on one node held the lock filter needs for a second per change.
MAX_NODE_DEVICES = 1024
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


@dataclass(frozen=True, slots=True)
class DraDevice:
    name: str
    product: str | None
    memory_mib: float | None
    mig: bool
    architecture: str | None = None
    compute_capability: str | None = None
    profile: str | None = None  # MIG profile, e.g. "3g.40gb"
    parent: str | None = None  # MIG: the parent GPU's UUID
    clique: str | None = None  # multi-node NVLink (IMEX) clique id, when the driver publishes one
    tainted: bool = False  # a NoSchedule or NoExecute taint in the slice (docs/dra.md, "Taints")
    uuid: str | None = None
    # Partitionable devices (KEP 4815, the driver's DynamicMIG): (counter set, ((counter, amount),
    # ...)) the device takes from its pool's shared counters when allocated.
    consumes: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    kind: str = "gpu"  # attribute ``type``: gpu, mig, vfio (passthrough), or a type we do not know
    pci: str | None = None  # standard attribute resource.kubernetes.io/pciBusID
    # Every attribute as (domain, name, value as text) and capacity as (domain, name, amount), for
    # selector predicates on them (device_satisfies).
    values: tuple[tuple[str, str, str], ...] = ()
    capacities: tuple[tuple[str, str, float], ...] = ()

    @property
    def full(self) -> bool:
        """A whole GPU for containers: not a MIG slice, not a GPU offered for VFIO passthrough (the
        driver publishes a passthrough-capable GPU twice, as ``gpu`` and ``vfio``: one GPU)."""
        return not self.mig and self.kind == "gpu"

    @property
    def counter_set(self) -> str | None:
        return self.consumes[0][0] if self.consumes else None


@dataclass(frozen=True, slots=True)
class MigSlices:
    """The MIG devices of one profile on one node."""

    profile: str
    memory_mib: float  # the smallest among them
    devices: tuple[tuple[str, str], ...]  # (pool, device name)


@dataclass(frozen=True, slots=True)
class DraNodeGpus:
    """What one node's slices of the GPU driver publish."""

    product: str | None  # the most common full-GPU product (MIG-only node: the parents' product)
    count: int  # full GPUs (MIG slices not counted: a full-GPU pod cannot use them)
    memory_mib: float | None  # the smallest full-GPU memory (a pod may land on any of them)
    mig_devices: int = 0
    mixed_products: bool = False
    mig: tuple[MigSlices, ...] = ()  # by profile
    mig_gpus: int = 0  # physical GPUs partitioned into MIG (distinct parents)
    clique: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimDemand:
    """GPUs one claim asks for (or holds, once allocated)."""

    gpus: int
    allocated: bool = False
    product: str | None = None  # a simple productName equality selector, for explain only
    all_devices: bool = False  # allocationMode All: at least one, the driver decides how many
    mig: int = 0  # MIG slices
    selection: Selection = field(default_factory=Selection)  # full-GPU requests' restrictions
    mig_selection: Selection = field(default_factory=Selection)  # MIG requests' restrictions
    # Of ``gpus``, shares of a device that allows several allocations (consumable capacity: a
    # request with ``capacity.requests``, a result with a ``shareID``). A share is one GPU to run
    # on, not a whole GPU taken: the device counts once on its node, however many shares it gives.
    shares: int = 0


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _attr(attrs: dict[str, Any], key: str) -> str | None:
    raw = attrs.get(key)
    if raw is None:
        raw = attrs.get(f"{DRIVER}/{key}")
    if not isinstance(raw, dict):
        return None
    for kind in ("string", "version", "int", "bool"):
        v = raw.get(kind)
        if v is not None and not isinstance(v, (dict, list)):
            return str(v)
    return None


# Attribute names a driver may give a device's multi-node NVLink clique (docs/dra.md, "IMEX cliques").
CLIQUE_ATTRS = ("cliqueID", "cliqueId", "clique")


def parse_device(dev: dict[str, Any]) -> DraDevice | None:
    if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
        return None
    attrs = _dict(dev.get("attributes"))
    cap = _dict(dev.get("capacity"))
    mem_raw = cap.get("memory", cap.get(f"{DRIVER}/memory"))
    mem_mib: float | None = None
    if isinstance(mem_raw, dict) and mem_raw.get("value") is not None:
        try:
            mem_mib = parse_quantity(mem_raw["value"]) / 2**20
        except ValueError:
            mem_mib = None
    dtype = (_attr(attrs, "type") or "").lower()
    profile, parent = _attr(attrs, "profile"), _attr(attrs, "parentUUID")
    mig = dtype == "mig" or parent is not None or profile is not None
    clique = next((c for c in (_attr(attrs, k) for k in CLIQUE_ATTRS) if c), None)
    taints = dev.get("taints")
    return DraDevice(name=dev["name"], product=_attr(attrs, "productName"), memory_mib=mem_mib, mig=mig,
                     architecture=_attr(attrs, "architecture"),
                     compute_capability=_attr(attrs, "cudaComputeCapability"),
                     profile=profile if mig else None, parent=parent if mig else None,
                     clique=clique[:MAX_NAME] if clique else None,
                     tainted=isinstance(taints, list) and any(_keeps_off(t) for t in taints[:MAX_DEVICES]),
                     uuid=_attr(attrs, "uuid"), consumes=_consumption(dev.get("consumesCounters")),
                     kind="mig" if mig else (dtype or "gpu"),
                     pci=_string(attrs.get(PCI_BUS_ID)),
                     values=_qualified(attrs, _text), capacities=_qualified(cap, _amount))


MAX_ATTRIBUTES = 64  # attributes and capacities read per device (the API allows 32 in all)


def _qualified(raw: dict[str, Any], value: Any) -> tuple[Any, ...]:
    """(domain, name, value) per entry of a device's attributes or capacity; the domain is "" for
    an unqualified name (the driver's own domain)."""
    out = []
    for key, v in list(raw.items())[:MAX_ATTRIBUTES]:
        domain, _, name = str(key).rpartition("/")
        got = value(v)
        if got is not None:
            out.append((domain, name, got))
    return tuple(out)


def _text(raw: Any) -> str | None:
    if not isinstance(raw, dict):
        return None
    for kind in ("string", "version", "int", "bool"):
        v = raw.get(kind)
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (str, int)):
            return str(v)[:MAX_NAME]
    return None


def _amount(raw: Any) -> float | None:
    try:
        return parse_quantity(raw["value"]) if isinstance(raw, dict) and "value" in raw else None
    except (ValueError, TypeError):
        return None


PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


def _string(raw: Any) -> str | None:
    v = raw.get("string") if isinstance(raw, dict) else None
    return v[:MAX_NAME] if isinstance(v, str) and v else None


MAX_COUNTERS = 64  # counters read per counter set (the API allows fewer per slice)


def _counters(raw: Any) -> tuple[tuple[str, float], ...]:
    """{name: {value: quantity}} as (name, amount) pairs; unreadable amounts are left out."""
    out = []
    for name, c in list(_dict(raw).items())[:MAX_COUNTERS]:
        try:
            out.append((str(name), parse_quantity(_dict(c)["value"])))
        except (KeyError, ValueError, TypeError):
            continue
    return tuple(out)


def _consumption(raw: Any) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    items = raw if isinstance(raw, list) else []
    return tuple((str(c["counterSet"]), _counters(c.get("counters"))) for c in items[:MAX_COUNTERS]
                 if isinstance(c, dict) and isinstance(c.get("counterSet"), str))


# Taint effects that keep new claims off a device (resource.k8s.io/v1 DeviceTaint): kube-scheduler
# allocates a tainted device only to a claim that tolerates the taint. "None" and effects unknown
# to us are informational (as the API asks consumers to treat unknown effects).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def _keeps_off(taint: Any) -> bool:
    return isinstance(taint, dict) and taint.get("effect") in BLOCKING_EFFECTS


def taint_rule(obj: dict[str, Any]) -> tuple[str | None, str | None, str | None] | None:
    """(driver, pool, device) a DeviceTaintRule taints, None meaning any; None when the rule keeps
    no claim off (informational effect, or no selector: "without a selector, no devices")."""
    spec = _dict(obj.get("spec")) if isinstance(obj, dict) else {}
    sel = spec.get("deviceSelector")
    if not isinstance(sel, dict) or not _keeps_off(spec.get("taint")):
        return None

    def one(key: str) -> str | None:
        v = sel.get(key)
        return v if isinstance(v, str) and v else None

    return one("driver"), one("pool"), one("device")


MAX_NAME = 253


@dataclass(slots=True)
class _Slice:
    node: str
    driver: str
    pool: str
    generation: int
    devices: tuple[DraDevice, ...]
    counters: dict[str, dict[str, float]] = field(default_factory=dict)  # spec.sharedCounters
    count: int = 1  # pool.resourceSliceCount: the slices the pool has at this generation


def parse_slice(obj: dict[str, Any]) -> _Slice | None:
    """One ResourceSlice; None for slices we cannot use (not per node, unreadable)."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(spec, dict):
        return None
    node, driver = spec.get("nodeName"), spec.get("driver")
    pool = _dict(spec.get("pool"))
    if not isinstance(node, str) or not node or not isinstance(driver, str):
        return None  # network-attached (allNodes / nodeSelector) devices are not a node's GPUs
    gen = pool.get("generation")
    raw_devices = spec.get("devices")
    devices: list[Any] = raw_devices if isinstance(raw_devices, list) else []
    parsed = tuple(d for d in (parse_device(x) for x in devices[:MAX_DEVICES]) if d is not None)
    # Counter sets may come in a slice of their own (the driver's DynamicMIG on Kubernetes 1.35+).
    raw_sets = spec.get("sharedCounters")
    sets = {str(c["name"]): dict(_counters(c.get("counters")))
            for c in (raw_sets if isinstance(raw_sets, list) else [])[:MAX_COUNTERS]
            if isinstance(c, dict) and isinstance(c.get("name"), str)}
    count = pool.get("resourceSliceCount")
    return _Slice(node=node, driver=driver, pool=str(pool.get("name") or node),
                  generation=gen if isinstance(gen, int) and not isinstance(gen, bool) else 0,
                  devices=parsed, counters=sets,
                  count=min(count, MAX_DEVICES) if isinstance(count, int) and not isinstance(count, bool)
                  and count > 0 else 1)


def _newest(slices: list[_Slice], driver: str) -> list[_Slice]:
    """The slices of the newest generation of each pool of ``driver``."""
    newest: dict[str, int] = {}
    for s in slices:
        if s.driver == driver:
            newest[s.pool] = max(newest.get(s.pool, s.generation), s.generation)
    return [s for s in slices if s.driver == driver and s.generation == newest.get(s.pool)]


def _current(slices: list[_Slice], driver: str) -> list[tuple[str, DraDevice]]:
    """(pool, device) of the newest generation of each pool of ``driver``."""
    return [(s.pool, d) for s in _newest(slices, driver) for d in s.devices]


def _physical(pool: str, d: DraDevice) -> tuple[str, str]:
    """Which physical GPU a device is (part of): its counter set when it has one (every device of a
    partitionable GPU takes from the same set), else a MIG slice's parent, else the device itself."""
    if d.counter_set is not None:
        return pool, "counters:" + d.counter_set
    if d.mig and d.parent:
        return "uuid", d.parent
    return "uuid", d.uuid or f"{pool}/{d.name}"


def _aliases(pool: str, d: DraDevice) -> set[tuple[str, str]]:
    """Every name a full GPU goes by as a physical GPU (its counter set, its UUID)."""
    out = {_physical(pool, d)}
    if d.uuid:
        out.add(("uuid", d.uuid))
    return out


def node_gpus(slices: list[_Slice], driver: str = DRIVER) -> DraNodeGpus | None:
    """Summarise the newest generation of each pool of ``driver`` on one node."""
    pooled = _current(slices, driver)
    if not pooled:
        return None
    devices = [d for _, d in pooled]
    full = [d for d in devices if d.full]
    products = Counter(d.product for d in full if d.product)
    mig_products = Counter(d.product for d in devices if d.mig and d.product)
    mems = [d.memory_mib for d in full if d.memory_mib]
    by_profile: dict[str, list[tuple[str, DraDevice]]] = {}
    for pool, d in pooled:
        if d.mig:
            by_profile.setdefault(d.profile or "unknown", []).append((pool, d))
    mig = tuple(
        MigSlices(profile=p, memory_mib=min((d.memory_mib or 0.0) for _, d in devs),
                  devices=tuple((pool, d.name) for pool, d in devs))
        for p, devs in sorted(by_profile.items()))
    cliques = Counter(d.clique for d in devices if d.clique)
    product = products.most_common(1)[0][0] if products else (
        mig_products.most_common(1)[0][0] if mig_products else None)
    # A partitionable GPU is published as its full device plus every MIG placement, all taking
    # from one counter set: one physical GPU, counted once, as a full GPU. MIG slices of a GPU with
    # no full device (static MIG) are its only trace: such GPUs are ``mig_gpus`` (for the price).
    whole = {_physical(pool, d) for pool, d in pooled if d.full}
    known = set().union(*(_aliases(pool, d) for pool, d in pooled if d.full))
    return DraNodeGpus(
        product=product,
        count=len(whole),
        memory_mib=min(mems) if mems else None,
        mig_devices=sum(1 for d in devices if d.mig),
        mixed_products=len(products) > 1,
        mig=mig,
        mig_gpus=len({_physical(pool, d) for pool, d in pooled if d.mig} - known),
        clique=cliques.most_common(1)[0][0] if cliques else None,
    )


Left = dict[tuple[str, str], dict[str, float]]  # (pool, counter set) -> counter -> amount left


def _counters_left(slices: list[_Slice], held: list[tuple[str, DraDevice]]) -> Left:
    """(pool, counter set) -> what the allocated devices leave of each shared counter."""
    left = {(s.pool, name): dict(c) for s in slices for name, c in s.counters.items()}
    for pool, d in held:
        for cset, amounts in d.consumes:
            have = left.get((pool, cset))
            if have is not None:
                for name, n in amounts:
                    if name in have:
                        have[name] -= n
    return left


def _fits(left: Left, pool: str, d: DraDevice) -> bool:
    """Could ``d`` still be allocated as far as counters go? A counter set not (yet) seen limits nothing."""
    for cset, amounts in d.consumes:
        have = left.get((pool, cset))
        if have is not None and any(name in have and have[name] < n - 1e-9 for name, n in amounts):
            return False
    return True


def overlay(node: dict[str, Any], gpus: DraNodeGpus | None, keys: NodeLabelKeys) -> dict[str, Any]:
    """``node`` as GFD would have labelled it for the GPUs its slices publish (docs/dra.md).

    Slices win over GFD labels and over allocatable ``nvidia.com/gpu`` (the first GPU resource key):
    one set of GPUs is either published by the DRA driver or by the device plugin, and with the
    extended-resource mapping allocatable is zero while the slices still list every GPU. A node
    whose GPUs are all MIG-partitioned keeps its parents' product (MIG slices come as facts of their
    own, ``DraIndex.mig_of``) and zero full GPUs. A clique id from the slices becomes the first
    NVLink-domain label unless the node already carries one (GFD's ``nvidia.com/gpu.clique``).
    """
    if gpus is None or (gpus.count == 0 and not gpus.mig and not gpus.clique):
        return node
    meta = dict(node.get("metadata") or {})
    labels = dict(meta.get("labels") or {})
    if gpus.clique and keys.nvlink_domain and not any(labels.get(k) for k in keys.nvlink_domain):
        labels[keys.nvlink_domain[0]] = gpus.clique
    if gpus.count == 0 and not gpus.mig:
        meta["labels"] = labels
        return {**node, "metadata": meta}
    if gpus.product and keys.gpu_product:
        for k in keys.gpu_product:
            labels.pop(k, None)
        labels[keys.gpu_product[0]] = gpus.product
    if keys.gpu_memory_mib:
        for k in keys.gpu_memory_mib:
            labels.pop(k, None)
        if gpus.memory_mib and gpus.count:
            labels[keys.gpu_memory_mib[0]] = str(int(gpus.memory_mib))
    meta["labels"] = labels
    status = dict(node.get("status") or {})
    for which in ("allocatable", "capacity"):
        res = dict(status.get(which) or {})
        if keys.gpu_resource:
            res[keys.gpu_resource[0]] = str(gpus.count)
        status[which] = res
    return {**node, "metadata": meta, "status": status}


# --- claims ------------------------------------------------------------------------------------


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


def _domain_key(kind: str, obj: dict[str, Any]) -> str:
    meta = _dict(obj.get("metadata"))
    return f"{kind}/{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _holds(result: Any, driver: str) -> bool:
    """Does this allocation result take a device of ``driver``? Not with admin access: kube-scheduler
    gives admin-access requests devices whether or not they are in use, and they stay usable by others
    (monitoring, debugging), so such a result is not a used GPU."""
    return (isinstance(result, dict) and result.get("driver") == driver
            and result.get("adminAccess") is not True)


def _devices_of(sel: Selection) -> str | None:
    """What a class (or request) of the driver hands out: "mig" slices, "gpu" (whole GPUs), or
    None for devices that are no container GPU (a ``vfio`` passthrough GPU, a type we do not know).
    A profile selector on a class naming no type asks for MIG slices (only those carry a profile)."""
    if sel.kind == "mig" or (sel.kind is None and sel.profiles is not None):
        return "mig"
    return "gpu" if sel.kind in (None, "gpu") else None


IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"  # every DeviceClass's implicit resource name


def _requested(container: Any, resource: str) -> int:
    """A container's request (or, for an extended resource, its limit) of ``resource``."""
    res = _dict(_dict(container).get("resources"))
    raw = _dict(res.get("requests")).get(resource, _dict(res.get("limits")).get(resource))
    try:
        return max(0, min(int(parse_quantity(raw)), MAX_DEVICES)) if raw is not None else 0
    except (ValueError, TypeError):
        return 0


def _count(req: dict[str, Any]) -> tuple[int, bool]:
    if str(req.get("allocationMode") or "ExactCount") == "All":
        return 1, True
    c = req.get("count", 1)
    c = c if isinstance(c, int) and not isinstance(c, bool) else 1
    return max(0, min(c, MAX_DEVICES)), False


def _product(sel: Selection) -> str | None:
    for how, values in sel.products:
        if how == "in" and len(values) == 1:
            return values[0]
    return None


@dataclass(frozen=True, slots=True)
class PodDevices:
    """A pod's devices of the driver through its claims (docs/dra.md), as WorkloadSpec fields."""

    gpus: int = 0
    gpu_products: tuple[tuple[str, tuple[str, ...]], ...] = ()
    gpu_min_memory_mib: float = 0.0
    mig: int = 0
    mig_profiles: tuple[str, ...] = ()  # empty: any profile
    mig_min_memory_mib: float = 0.0
    notes: tuple[str, ...] = ()
    claims: tuple[tuple[str, int], ...] = ()  # (ns/name, full GPUs) of the claims that have a name
    held: int = 0  # of those, the GPUs of claims already allocated
    shares: int = 0  # of ``gpus``, shares of a device (ClaimDemand.shares)

    def fields(self) -> dict[str, Any]:
        """The WorkloadSpec fields (memory in GB, as node facts count it)."""
        gb = 1.048576 / 1000.0  # MiB -> GB
        out: dict[str, Any] = {}
        if self.gpu_products:
            out["gpu_products"] = self.gpu_products
        if self.gpu_min_memory_mib:
            out["gpu_min_memory_gb"] = self.gpu_min_memory_mib * gb
        if self.mig:
            out["mig_slices"] = self.mig
            out["mig_profiles"] = self.mig_profiles
            out["mig_min_memory_gb"] = self.mig_min_memory_mib * gb
        if self.notes:
            out["claim_notes"] = self.notes
        if self.claims:
            out["claim_gpus"] = self.claims
            out["held_gpus"] = self.held
        if self.shares:
            out["shared_gpus"] = self.shares
        return out


@dataclass(slots=True)
class DraIndex:
    """Everything DRA the extender knows; fed by watches, read by node facts and workload parsing."""

    driver: str = DRIVER
    enabled: bool = False  # the API exists and the slices were listed
    # Set once the watcher has listed the resource.k8s.io kinds: pods parsed from then on count
    # their claims' GPUs (ClusterSnapshot.claim_reader).
    reads_claims: bool = False
    slices: dict[str, _Slice] = field(default_factory=dict)  # slice name -> parsed
    by_node: dict[str, set[str]] = field(default_factory=dict)  # node -> slice names
    node_devices: dict[str, int] = field(default_factory=dict)  # node -> devices in its slices
    classes: dict[str, Selection] = field(default_factory=dict)  # name -> what it selects
    extended: dict[str, str] = field(default_factory=dict)  # spec.extendedResourceName -> class
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # ns/name -> spec+status
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)  # ns/name -> claim spec
    # (pool, device) of the driver -> claims holding it (from status.allocation): MIG slices free
    # on a node are the published ones nobody holds (docs/dra.md, "MIG").
    held: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    claim_devices: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    pool_node: dict[str, str] = field(default_factory=dict)  # pool -> node (the driver's pools)
    # DeviceTaintRule name -> (driver, pool, device) it keeps claims off, None meaning any.
    taint_rules: dict[str, tuple[str | None, str | None, str | None]] = field(default_factory=dict)
    slices_version: int = 0  # bumped on every slice change (the cache below keys on it)
    # kind/namespace/name of a ComputeDomainClique or ComputeDomain -> node -> clique id.
    domain_cliques: dict[str, dict[str, str]] = field(default_factory=dict)
    _match_cache: dict[Any, tuple[str, ...]] = field(default_factory=dict)
    # pool -> the slices of its last complete generation (all resourceSliceCount of them seen).
    complete: dict[str, tuple[_Slice, ...]] = field(default_factory=dict)
    _summaries: dict[str, tuple[int, DraNodeGpus | None]] = field(default_factory=dict)

    # --- slices -----------------------------------------------------------------------------------
    def put_slice(self, obj: dict[str, Any]) -> str | None:
        """Add or replace a slice; returns the node whose facts changed (None if none)."""
        return self.put_parsed_slice(obj, parse_slice(obj))

    def put_parsed_slice(self, obj: dict[str, Any], s: _Slice | None) -> str | None:
        """``put_slice`` with ``parse_slice(obj)`` done beforehand, outside the service lock (a slice
        of 128 devices takes milliseconds to read, and filter waits for that lock)."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        self.slices_version += 1
        old = self.slices.pop(name, None)
        if old is not None:
            self.by_node.get(old.node, set()).discard(name)
            self.node_devices[old.node] = self.node_devices.get(old.node, 0) - len(old.devices)
        if s is not None:
            self.node_devices[s.node] = self.node_devices.get(s.node, 0) + len(s.devices)
        if s is not None:
            self.slices[name] = s
            self.by_node.setdefault(s.node, set()).add(name)
            if s.driver == self.driver:
                self.pool_node[s.pool] = s.node
                self._note_complete(s.node, s.pool)
        if old is not None and old.driver == self.driver and (s is None or s.pool != old.pool):
            self._note_complete(old.node, old.pool)
        return s.node if s is not None else (old.node if old is not None else None)

    def drop_slice(self, name: str) -> str | None:
        self.slices_version += 1
        old = self.slices.pop(name, None)
        if old is None:
            return None
        self.by_node.get(old.node, set()).discard(name)
        self.node_devices[old.node] = self.node_devices.get(old.node, 0) - len(old.devices)
        if old.driver == self.driver:
            self._note_complete(old.node, old.pool)
        return old.node

    def clear_slices(self) -> None:
        self.slices_version += 1
        self.slices.clear()
        self.by_node.clear()
        self.node_devices.clear()
        self.complete.clear()

    def _note_complete(self, node: str, pool: str) -> None:
        """Remember the pool's newest generation once all its slices are in; forget a pool gone."""
        mine = [s for s in self._raw_slices(node) if s.driver == self.driver and s.pool == pool]
        if not mine:
            self.complete.pop(pool, None)
            return
        newest = _newest(mine, self.driver)
        if len(newest) >= newest[0].count:
            self.complete[pool] = tuple(newest)

    def _raw_slices(self, node: str) -> list[_Slice]:
        return [self.slices[n] for n in sorted(self.by_node.get(node, ())) if n in self.slices]

    def _node_slices(self, node: str) -> list[_Slice]:
        """The node's slices, the driver's pools at their newest generation once all its slices are
        in (``resourceSliceCount``): while the driver republishes a pool, slice by slice, its last
        complete generation stands, so that the node does not seem to lose its GPUs meanwhile (the
        driver's DynamicMIG publishes its counters and each GPU's devices in slices of their own)."""
        raw = self._raw_slices(node)
        out = [s for s in raw if s.driver != self.driver]
        pools = {s.pool for s in raw if s.driver == self.driver}
        for pool in sorted(pools):
            newest = _newest([s for s in raw if s.driver == self.driver and s.pool == pool], self.driver)
            out += newest if len(newest) >= newest[0].count or pool not in self.complete \
                else list(self.complete[pool])
        return out

    def over_limit(self, node: str) -> bool:
        """The node publishes more than MAX_NODE_DEVICES devices: its DRA GPUs are not read."""
        return self.node_devices.get(node, 0) > MAX_NODE_DEVICES

    def gpus_of(self, node: str) -> DraNodeGpus | None:
        names = self.by_node.get(node)
        if not names or self.over_limit(node):
            return None
        # Overlay, MIG slices and MIG parents all read the summary: one computation per change of
        # the slices, not three (a node may carry hundreds of slices; docs/dra.md, "Churn").
        hit = self._summaries.get(node)
        if hit is not None and hit[0] == self.slices_version:
            return hit[1]
        got = node_gpus(self._node_slices(node), self.driver)
        self._summaries[node] = (self.slices_version, got)
        return got

    def overlay(self, node: dict[str, Any], keys: NodeLabelKeys) -> dict[str, Any]:
        name = (node.get("metadata") or {}).get("name") if isinstance(node, dict) else None
        if not isinstance(name, str) or not (self.by_node or self.domain_cliques):
            return node
        gpus = self.gpus_of(name)
        clique = self.node_clique(name)
        if clique and (gpus is None or not gpus.clique):
            # The slices carry no clique id: the one the ComputeDomain daemons report for the node.
            gpus = replace(gpus, clique=clique) if gpus is not None else \
                DraNodeGpus(product=None, count=0, memory_mib=None, clique=clique)
        return overlay(node, gpus, keys)

    # --- ComputeDomain cliques (the driver's compute-domain.nvidia.com side) -------------------------
    def put_domain(self, kind: str, obj: dict[str, Any]) -> set[str]:
        """A ComputeDomainClique (``daemons[]``) or ComputeDomain (``status.nodes[]``, when the driver
        does not use clique objects): the NVLink clique id of each node in it. Returns the nodes
        whose clique id may have changed."""
        key = _domain_key(kind, obj)
        raw = obj.get("daemons") if kind == "computedomaincliques" else _dict(obj.get("status")).get("nodes")
        nodes: dict[str, str] = {}
        for d in (raw if isinstance(raw, list) else [])[:MAX_DEVICES]:
            node = _dict(d).get("nodeName" if kind == "computedomaincliques" else "name")
            clique = _dict(d).get("cliqueID")
            if isinstance(node, str) and node and isinstance(clique, str) and clique:
                nodes[node] = clique[:MAX_NAME]
        old = self.domain_cliques.pop(key, {})
        if nodes:
            self.domain_cliques[key] = nodes
        return {n for n in set(old) | set(nodes) if old.get(n) != nodes.get(n)}

    def drop_domain(self, kind: str, obj: dict[str, Any]) -> set[str]:
        return set(self.domain_cliques.pop(_domain_key(kind, obj), {}))

    def clear_domains(self, kind: str) -> set[str]:
        gone = [k for k in self.domain_cliques if k.startswith(kind + "/")]
        return set().union(*(set(self.domain_cliques.pop(k)) for k in gone))

    def node_clique(self, node: str) -> str | None:
        seen = Counter(c[node] for c in self.domain_cliques.values() if node in c)
        return seen.most_common(1)[0][0] if seen else None

    def mig_of(self, node: str) -> tuple[tuple[str, float, int, int], ...]:
        """(profile, memory GB, slices, free slices) per MIG profile of ``node``: free are those no
        allocated claim holds. Node facts (``NodeFacts.mig``)."""
        gpus = self.gpus_of(node) if self.by_node.get(node) else None
        if gpus is None or not gpus.mig:
            return ()  # none, or over the device limit
        gb = 1.048576 / 1000.0
        busy = self._unavailable(node)
        return tuple((m.profile, m.memory_mib * gb, len(m.devices),
                      sum(1 for d in m.devices if d not in busy))
                     for m in gpus.mig)

    def busy_gpus(self, node: str) -> int:
        """Full GPUs of ``node`` not free for a new claim (docs/dra.md, "Free GPUs")."""
        if not self.by_node.get(node) or self.over_limit(node):
            return 0
        busy = self._unavailable(node)
        whole: dict[tuple[str, str], bool] = {}  # physical GPU -> one of its full devices is free
        for p, d in _current(self._node_slices(node), self.driver):
            if d.full:
                key = _physical(p, d)
                whole[key] = whole.get(key, False) or (p, d.name) not in busy
        return sum(1 for free in whole.values() if not free)

    def _unavailable(self, node: str) -> set[tuple[str, str]]:
        """(pool, device) of ``node`` kube-scheduler would not hand to a new claim of our pods:

        * held by an allocated claim, whether or not a pod of ours uses it (a claim allocated ahead
          of its pods, or shared by several, holds its devices once);
        * tainted NoSchedule / NoExecute, in the slice or by a DeviceTaintRule (tolerations are not
          read: a tainted device is not capacity for our pods);
        * partitionable: taking more of its counter set than the allocated devices leave (a GPU
          with any MIG partition allocated is not whole-free, nor are the placements overlapping it);
        * a GPU whose VFIO passthrough twin is allocated.
        """
        slices = _newest(self._node_slices(node), self.driver)
        pooled = [(s.pool, d) for s in slices for d in s.devices]
        held = [(p, d) for p, d in pooled if self.held.get((p, d.name))]
        out = {(pool, d.name) for pool, d in pooled
               if self.held.get((pool, d.name)) or d.tainted or self._rule_taints(pool, d.name)}
        left = _counters_left(slices, held)
        out |= {(pool, d.name) for pool, d in pooled if not _fits(left, pool, d)}
        # A GPU whose passthrough twin (same PCI bus id) is allocated is gone until the driver
        # republishes the node without it; kube-scheduler does not know they are one GPU.
        passed = {d.pci for _, d in held if d.kind == "vfio" and d.pci}
        out |= {(pool, d.name) for pool, d in pooled if d.full and d.pci in passed}
        return out

    def _rule_taints(self, pool: str, device: str) -> bool:
        return any((drv is None or drv == self.driver) and (p is None or p == pool)
                   and (dev is None or dev == device) for drv, p, dev in self.taint_rules.values())

    def put_taint_rule(self, obj: dict[str, Any]) -> set[str]:
        """Add or replace a DeviceTaintRule; returns the nodes whose devices it may concern."""
        name = str(_dict(obj.get("metadata")).get("name") or "")
        old = self.taint_rules.pop(name, None)
        rule = taint_rule(obj)
        if rule is not None:
            self.taint_rules[name] = rule
        return self._rule_nodes(old) | self._rule_nodes(rule)

    def drop_taint_rule(self, name: str) -> set[str]:
        return self._rule_nodes(self.taint_rules.pop(name, None))

    def clear_taint_rules(self) -> set[str]:
        nodes = set().union(*(self._rule_nodes(r) for r in self.taint_rules.values()))
        self.taint_rules.clear()
        return nodes

    def _rule_nodes(self, rule: tuple[str | None, str | None, str | None] | None) -> set[str]:
        if rule is None or (rule[0] is not None and rule[0] != self.driver):
            return set()
        if rule[1] is not None:
            return {self.pool_node[rule[1]]} if rule[1] in self.pool_node else set()
        return set(self.pool_node.values())

    def mig_parents(self, node: str) -> int:
        gpus = self.gpus_of(node) if self.by_node.get(node) else None
        return gpus.mig_gpus if gpus is not None else 0

    def _device(self, pool: str, device: str) -> DraDevice | None:
        node = self.pool_node.get(pool)
        candidates = [self.slices[n] for n in self.by_node.get(node, ()) if n in self.slices] \
            if node is not None else list(self.slices.values())
        for s in candidates:
            if s.driver == self.driver and s.pool == pool:
                for d in s.devices:
                    if d.name == device:
                        return d
        return None

    # --- device predicates -------------------------------------------------------------------------
    def _resolve(self, sel: Selection, mig: bool) -> Selection:
        """``sel`` with its device predicates turned into what node facts can check: the products
        (MIG: the profiles) that have a device satisfying them all, wherever it is published. A node
        is then accepted when its GPU model has such a device somewhere: per model, not per device
        (only ever wider than kube-scheduler's per-device check, never narrower)."""
        if not sel.device:
            return sel
        got = self._matching(sel.device[:MAX_PREDICATES], mig)
        if mig:
            return replace(sel, device=(), profiles=tuple(p for p in sel.profiles or got if p in got))
        return replace(sel, device=(), products=(*sel.products, ("in", got)))

    def _matching(self, preds: tuple[DevicePredicate, ...], mig: bool) -> tuple[str, ...]:
        key = (preds, mig, self.slices_version)
        if (hit := self._match_cache.get(key)) is not None:
            return hit
        found = set()
        for node in self.by_node:
            for _, d in _current(self._node_slices(node), self.driver):
                name = d.profile if mig else d.product
                if name and (d.mig if mig else d.full) and device_satisfies(d, preds, self.driver):
                    found.add(name)
        if len(self._match_cache) > MAX_DEVICES:
            self._match_cache.clear()
        self._match_cache[key] = got = tuple(sorted(found))
        return got

    # --- claims -----------------------------------------------------------------------------------
    def put_class(self, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        self.drop_class(name)
        self.classes[name] = class_selection(obj)
        ext = _dict(obj.get("spec")).get("extendedResourceName")
        if isinstance(ext, str) and ext:
            self.extended[ext] = name

    def drop_class(self, name: str) -> None:
        self.classes.pop(name, None)
        for ext in [e for e, c in self.extended.items() if c == name]:
            del self.extended[ext]

    def clear_classes(self) -> None:
        self.classes.clear()
        self.extended.clear()

    def demand(self, claim_spec: dict[str, Any], status: dict[str, Any] | None = None) -> ClaimDemand:
        """Full GPUs and MIG slices of our driver a claim holds (allocated) or asks for (not yet)."""
        alloc = (status or {}).get("allocation") if isinstance(status, dict) else None
        if isinstance(alloc, dict):
            return self._allocated(alloc)
        reqs = ((claim_spec.get("devices") or {}).get("requests")) if isinstance(claim_spec, dict) else None
        total, mig_total, shares, product, every = 0, 0, 0, None, False
        full_sel, mig_sel = Selection(), Selection()
        for req in reqs if isinstance(reqs, list) else []:
            if not isinstance(req, dict):
                continue
            # firstAvailable: kube-scheduler tries the alternatives in order; count the first one
            # of our driver (a lower count later in the list can only free devices). Its
            # restrictions are not applied: a later alternative may be what gets allocated.
            first = isinstance(req.get("firstAvailable"), list) and not isinstance(req.get("exactly"), dict)
            options = [req["exactly"]] if isinstance(req.get("exactly"), dict) else \
                [o for o in req.get("firstAvailable") or [] if isinstance(o, dict)]
            if not options and "deviceClassName" in req:
                options = [req]  # v1beta1-shaped request
            for opt in options:
                if opt.get("adminAccess") is True:
                    break  # admin access: devices already in use, none taken (docs/dra.md)
                cls = self.classes.get(str(opt.get("deviceClassName")))
                if cls is None or cls.driver != self.driver:
                    continue
                sel = cls.merge(read_selectors(opt.get("selectors"), self.driver))
                c, all_mode = _count(opt)
                if _devices_of(sel) == "mig":
                    mig_total += c
                    if not first:
                        mig_sel = mig_sel.merge(self._resolve(sel, mig=True))
                elif _devices_of(sel) is None:
                    pass  # vfio.gpu.nvidia.com: a GPU passed through to a VM, no container GPU
                else:
                    total += c
                    shares += c if _dict(_dict(opt.get("capacity")).get("requests")) else 0
                    every = every or all_mode
                    product = product or _product(sel)
                    if not first:
                        full_sel = full_sel.merge(self._resolve(sel, mig=False))
                    elif sel.unread or sel.products or sel.min_memory_mib or sel.device:
                        full_sel = full_sel.merge(Selection(unread=("firstAvailable alternatives",)))
                break
        return ClaimDemand(gpus=min(total, MAX_DEVICES), product=product, all_devices=every,
                           mig=min(mig_total, MAX_DEVICES), selection=full_sel, mig_selection=mig_sel,
                           shares=min(shares, total, MAX_DEVICES))

    def _allocated(self, alloc: dict[str, Any]) -> ClaimDemand:
        """What an allocated claim holds: exact, so the MIG profiles held are the only ones its
        pods may use."""
        results = ((alloc.get("devices") or {}).get("results")) or []
        n = mig = shares = 0
        profiles: list[str] = []
        for r in (results if isinstance(results, list) else [])[:MAX_DEVICES]:
            if not _holds(r, self.driver):
                continue
            d = self._device(str(r.get("pool")), str(r.get("device")))
            if d is not None and d.mig:
                mig += 1
                if d.profile and d.profile not in profiles:
                    profiles.append(d.profile)
            elif d is not None and not d.full:
                continue  # a passthrough GPU (VFIO) is a virtual machine's, not a container GPU
            else:
                n += 1
                shares += r.get("shareID") is not None
        return ClaimDemand(gpus=n, allocated=True, mig=mig, shares=shares,
                           mig_selection=Selection(profiles=tuple(profiles) or None))

    def put_claim(self, obj: dict[str, Any]) -> set[str]:
        """Add or replace a claim; returns the nodes whose held devices changed."""
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        status = obj.get("status") or {}
        self.claims[key] = {"spec": obj.get("spec") or {}, "status": status}
        alloc = status.get("allocation") if isinstance(status, dict) else None
        results = ((alloc.get("devices") or {}).get("results") or []) if isinstance(alloc, dict) else []
        devices = tuple((str(r.get("pool")), str(r.get("device"))) for r in
                        (results if isinstance(results, list) else [])[:MAX_DEVICES]
                        if _holds(r, self.driver))
        return self._hold(key, devices)

    def drop_claim(self, key: str) -> set[str]:
        self.claims.pop(key, None)
        return self._hold(key, ())

    def _hold(self, key: str, devices: tuple[tuple[str, str], ...]) -> set[str]:
        old = self.claim_devices.pop(key, ())
        if old == devices:
            if devices:
                self.claim_devices[key] = devices
            return set()
        for d in old:
            holders = self.held.get(d)
            if holders is not None:
                holders.discard(key)
                if not holders:
                    del self.held[d]
        for d in devices:
            self.held.setdefault(d, set()).add(key)
        if devices:
            self.claim_devices[key] = devices
        # Full GPUs held count on their node (ClusterSnapshot.refresh_dra), MIG slices held are
        # node facts: either way the nodes of the devices taken or given back change.
        return {self.pool_node[p] for p, _ in set(old) ^ set(devices) if p in self.pool_node}

    def clear_claims(self) -> set[str]:
        nodes = {self.pool_node[p] for p, _ in self.held if p in self.pool_node}
        self.claims.clear()
        self.held.clear()
        self.claim_devices.clear()
        return nodes

    def put_template(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        self.templates[key] = ((obj.get("spec") or {}).get("spec")) or {}

    def _claim_demands(self, pod: dict[str, Any]) -> list[tuple[str | None, ClaimDemand]]:
        """(claim ns/name, demand) per entry of ``spec.resourceClaims``; the key is None for a
        template whose claim does not exist yet."""
        spec = pod.get("spec") if isinstance(pod, dict) else None
        refs = spec.get("resourceClaims") if isinstance(spec, dict) else None
        if not refs or not isinstance(refs, list):
            return []
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        generated: dict[str, str] = {}
        for st in ((pod.get("status") or {}).get("resourceClaimStatuses") or []):
            if isinstance(st, dict) and isinstance(st.get("resourceClaimName"), str):
                generated[str(st.get("name"))] = st["resourceClaimName"]
        out: list[tuple[str | None, ClaimDemand]] = []
        for ref in refs[:MAX_DEVICES]:
            if not isinstance(ref, dict):
                continue
            claim_name = ref.get("resourceClaimName") or generated.get(str(ref.get("name")))
            key = f"{ns}/{claim_name}" if isinstance(claim_name, str) else None
            if key is not None and (c := self.claims.get(key)) is not None:
                out.append((key, self.demand(c["spec"], c["status"])))
            elif isinstance(ref.get("resourceClaimTemplateName"), str):
                tmpl = self.templates.get(f"{ns}/{ref['resourceClaimTemplateName']}")
                if tmpl is not None:
                    out.append((None, self.demand(tmpl)))
        return out

    def is_allocated(self, key: str) -> bool:
        status = (self.claims.get(key) or {}).get("status")
        return isinstance(status, dict) and isinstance(status.get("allocation"), dict)

    def pod_gpus(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> int:
        """Full GPUs a pod's claims hold or ask for, plus those its containers ask for as extended
        resources a DeviceClass of the driver backs and ``counted`` (the extended resources read as
        GPUs anyway) leaves out. 0 when it has none or DRA is not in use."""
        ext = sum(n for name, n, cls in self._extended_requests(pod)
                  if name not in counted and _devices_of(cls) == "gpu")
        return min(sum(d.gpus for _, d in self._claim_demands(pod)) + ext, MAX_DEVICES)

    def pod_devices(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> PodDevices:
        """Everything a pod's claims (and extended resources backed by a DeviceClass) say beyond
        the full-GPU count: MIG slices, the restrictions of recognised selectors, the selectors left
        to kube-scheduler, and which claims hold or ask for how many full GPUs (docs/dra.md)."""
        keyed = self._claim_demands(pod)
        ext = self._extended_claim(pod)
        backed = [(name, n, cls) for name, n, cls in self._extended_requests(pod) if name not in counted]
        if not keyed and ext is None and not backed:
            return PodDevices()
        full, migs = Selection(), Selection()
        mig = 0
        for _, n, cls in backed:
            if _devices_of(cls) == "mig":
                mig += n
                migs = migs.merge(self._resolve(cls, mig=True))
            else:
                full = full.merge(self._resolve(cls, mig=False))
        for _, d in keyed:
            if d.gpus and not d.allocated:
                full = full.merge(d.selection)
            if d.mig:
                mig += d.mig
                migs = migs.merge(d.mig_selection)
        notes = tuple(dict.fromkeys(full.unread + migs.unread))[:8]
        # Whole GPUs per claim: what the pod is charged while the claim is not allocated.
        claims = [(k, d.gpus - d.shares) for k, d in keyed if k is not None and d.gpus > d.shares]
        if ext is not None and ext[1]:
            claims.append(ext)
        return PodDevices(
            gpus=min(sum(d.gpus for _, d in keyed), MAX_DEVICES),
            gpu_products=full.products[:MAX_PREDICATES], gpu_min_memory_mib=full.min_memory_mib,
            mig=min(mig, MAX_DEVICES), mig_profiles=migs.profiles or (),
            mig_min_memory_mib=migs.min_memory_mib,
            notes=tuple(f"selector not interpreted, left to kube-scheduler: {n}" for n in notes),
            claims=tuple(claims[:MAX_DEVICES]),
            held=min(sum(n for k, n in claims if self.is_allocated(k)), MAX_DEVICES),
            shares=min(sum(d.shares for _, d in keyed), MAX_DEVICES))

    # --- extended resources backed by a DeviceClass (DRAExtendedResource) -------------------------
    def _gpu_resource_class(self, resource: Any) -> bool:
        """Does the extended resource name a full-GPU class of the driver? Either a class's
        ``spec.extendedResourceName`` or the implicit ``deviceclass.resource.kubernetes.io/<class>``."""
        cls = self._backing_class(resource) if isinstance(resource, str) else None
        return cls is not None and _devices_of(cls) == "gpu"

    def _backing_class(self, resource: str) -> Selection | None:
        """The DeviceClass of the driver an extended resource name stands for (None: none)."""
        name = resource[len(IMPLICIT_PREFIX):] if resource.startswith(IMPLICIT_PREFIX) \
            else self.extended.get(resource)
        cls = self.classes.get(name) if name else None
        return cls if cls is not None and cls.driver == self.driver else None

    def _extended_requests(self, pod: dict[str, Any]) -> list[tuple[str, int, Selection]]:
        """(resource, devices, class) per extended resource of the pod's containers that a
        DeviceClass of the driver backs (kube-scheduler turns them into a claim of that class):
        the sum over containers, or the largest init container's if that is more."""
        if not self.extended and not self.classes:
            return []
        spec = _dict(pod.get("spec")) if isinstance(pod, dict) else {}
        regular: Counter[str] = Counter()
        init: Counter[str] = Counter()
        for which, into in (("containers", regular), ("initContainers", init)):
            containers = spec.get(which)
            for c in (containers if isinstance(containers, list) else [])[:MAX_DEVICES]:
                res = _dict(_dict(c).get("resources"))
                for name in set(_dict(res.get("requests"))) | set(_dict(res.get("limits"))):
                    if isinstance(name, str) and "/" in name and self._backing_class(name) is not None:
                        n = _requested(c, name)
                        into[name] = into[name] + n if into is regular else max(into[name], n)
        out = []
        for name in sorted(set(regular) | set(init)):
            cls = self._backing_class(name)
            n = max(regular[name], init[name])
            if cls is not None and n and _devices_of(cls) is not None:
                out.append((name, min(n, MAX_DEVICES), cls))
        return out

    def _extended_claim(self, pod: dict[str, Any]) -> tuple[str, int] | None:
        """(ns/name, full GPUs) of the claim kube-scheduler made for the pod's extended resources
        (``status.extendedResourceClaimStatus``): the GPUs of the container requests it maps to a
        full-GPU class of the driver. They are counted as extended resources already; once the
        claim is allocated its devices count on the node instead."""
        st = (pod.get("status") or {}).get("extendedResourceClaimStatus") if isinstance(pod, dict) else None
        if not isinstance(st, dict) or not isinstance(st.get("resourceClaimName"), str):
            return None
        spec = _dict(pod.get("spec"))
        ns = str(_dict(pod.get("metadata")).get("namespace") or "default")
        regular = {str(c.get("name")): c for c in spec.get("containers") or [] if isinstance(c, dict)}
        init = {str(c.get("name")): c for c in spec.get("initContainers") or [] if isinstance(c, dict)}
        total = largest_init = 0
        for m in (st.get("requestMappings") or [])[:MAX_DEVICES]:
            if not isinstance(m, dict) or not self._gpu_resource_class(m.get("resourceName")):
                continue
            name = str(m.get("containerName"))
            n = _requested(regular.get(name) or init.get(name), str(m.get("resourceName")))
            if name in regular:
                total += n
            else:
                largest_init = max(largest_init, n)
        return f"{ns}/{st['resourceClaimName']}", min(max(total, largest_init), MAX_DEVICES)
