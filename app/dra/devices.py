"""One device of a ResourceSlice as the facts we keep of it (``DraDevice``): product, memory, MIG
profile and parent, clique, taints, shared-counter consumption, and every attribute and capacity for
selector predicates (docs/dra.md). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.base.units import parse_quantity

DRIVER = "gpu.nvidia.com"
# Safety bounds: a claim asks for at most this many devices per request in our accounting.
MAX_DEVICES = 1024
MAX_NAME = 253
MAX_ATTRIBUTES = 64  # attributes and capacities read per device (the API allows 32 in all)
MAX_COUNTERS = 64  # counters read per counter set (the API allows fewer per slice)
# Attribute names a driver may give a device's multi-node NVLink clique (docs/dra.md, "IMEX cliques").
CLIQUE_ATTRS = ("cliqueID", "cliqueId", "clique")
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
# Taint effects that keep new claims off a device (resource.k8s.io/v1 DeviceTaint): kube-scheduler
# allocates a tainted device only to a claim that tolerates the taint. "None" and effects unknown
# to us are informational (as the API asks consumers to treat unknown effects).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

# (counter set, ((counter, amount), ...)) per counter set a device takes from.
Consumption = tuple[tuple[str, tuple[tuple[str, float], ...]], ...]


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


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
    consumes: Consumption = ()
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


def parse_device(dev: dict[str, Any]) -> DraDevice | None:
    if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
        return None
    attrs = as_dict(dev.get("attributes"))
    cap = as_dict(dev.get("capacity"))
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
                     tainted=isinstance(taints, list) and any(keeps_off(t) for t in taints[:MAX_DEVICES]),
                     uuid=_attr(attrs, "uuid"), consumes=_consumption(dev.get("consumesCounters")),
                     kind="mig" if mig else (dtype or "gpu"),
                     pci=_string(attrs.get(PCI_BUS_ID)),
                     values=_qualified(attrs, _text), capacities=_qualified(cap, _amount))


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


def _string(raw: Any) -> str | None:
    v = raw.get("string") if isinstance(raw, dict) else None
    return v[:MAX_NAME] if isinstance(v, str) and v else None


def counter_amounts(raw: Any) -> tuple[tuple[str, float], ...]:
    """{name: {value: quantity}} as (name, amount) pairs; unreadable amounts are left out."""
    out = []
    for name, c in list(as_dict(raw).items())[:MAX_COUNTERS]:
        try:
            out.append((str(name), parse_quantity(as_dict(c)["value"])))
        except (KeyError, ValueError, TypeError):
            continue
    return tuple(out)


def _consumption(raw: Any) -> Consumption:
    items = raw if isinstance(raw, list) else []
    return tuple((str(c["counterSet"]), counter_amounts(c.get("counters"))) for c in items[:MAX_COUNTERS]
                 if isinstance(c, dict) and isinstance(c.get("counterSet"), str))


def keeps_off(taint: Any) -> bool:
    return isinstance(taint, dict) and taint.get("effect") in BLOCKING_EFFECTS
