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
from dataclasses import dataclass, field
from typing import Any

from app.core.policy import NodeLabelKeys
from app.core.units import parse_quantity

DRIVER = "gpu.nvidia.com"
# Safety bounds: a claim asks for at most this many devices per request in our accounting.
MAX_DEVICES = 1024
# ``device.driver == "gpu.nvidia.com"`` (either quote) inside a DeviceClass selector.
_DRIVER_RE = re.compile(r"""device\.driver\s*==\s*["']([^"']+)["']""")
# ``device.attributes["gpu.nvidia.com"].productName == "..."``; anything fancier is "any GPU".
_PRODUCT_RE = re.compile(
    r"""^\s*device\.attributes\[["']([^"']+)["']\]\.productName\s*==\s*["']([^"']+)["']\s*$""")
# ``device.attributes["gpu.nvidia.com"].type == "mig"``: the class hands out MIG slices.
_TYPE_RE = re.compile(r"""\.type\s*==\s*["'](\w+)["']""")


@dataclass(frozen=True, slots=True)
class DraDevice:
    name: str
    product: str | None
    memory_mib: float | None
    mig: bool
    architecture: str | None = None
    compute_capability: str | None = None


@dataclass(frozen=True, slots=True)
class DraNodeGpus:
    """What one node's slices of the GPU driver publish."""

    product: str | None  # the most common full-GPU product
    count: int  # full GPUs (MIG slices not counted, like GFD's MIG products)
    memory_mib: float | None  # the smallest full-GPU memory (a pod may land on any of them)
    mig_devices: int = 0
    mixed_products: bool = False


@dataclass(frozen=True, slots=True)
class ClaimDemand:
    """GPUs one claim asks for (or holds, once allocated)."""

    gpus: int
    allocated: bool = False
    product: str | None = None  # a simple productName equality selector, for explain only
    all_devices: bool = False  # allocationMode All: at least one, the driver decides how many


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
    mig = dtype == "mig" or _attr(attrs, "parentUUID") is not None or _attr(attrs, "profile") is not None
    return DraDevice(name=dev["name"], product=_attr(attrs, "productName"), memory_mib=mem_mib, mig=mig,
                     architecture=_attr(attrs, "architecture"),
                     compute_capability=_attr(attrs, "cudaComputeCapability"))


@dataclass(slots=True)
class _Slice:
    node: str
    driver: str
    pool: str
    generation: int
    devices: tuple[DraDevice, ...]


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
    return _Slice(node=node, driver=driver, pool=str(pool.get("name") or node),
                  generation=gen if isinstance(gen, int) and not isinstance(gen, bool) else 0,
                  devices=parsed)


def node_gpus(slices: list[_Slice], driver: str = DRIVER) -> DraNodeGpus | None:
    """Summarise the newest generation of each pool of ``driver`` on one node."""
    newest: dict[str, int] = {}
    for s in slices:
        if s.driver == driver:
            newest[s.pool] = max(newest.get(s.pool, s.generation), s.generation)
    devices = [d for s in slices if s.driver == driver and s.generation == newest.get(s.pool)
               for d in s.devices]
    if not devices:
        return None
    full = [d for d in devices if not d.mig]
    products = Counter(d.product for d in full if d.product)
    mems = [d.memory_mib for d in full if d.memory_mib]
    return DraNodeGpus(
        product=products.most_common(1)[0][0] if products else None,
        count=len(full),
        memory_mib=min(mems) if mems else None,
        mig_devices=len(devices) - len(full),
        mixed_products=len(products) > 1,
    )


def overlay(node: dict[str, Any], gpus: DraNodeGpus | None, keys: NodeLabelKeys) -> dict[str, Any]:
    """``node`` as GFD would have labelled it for the GPUs its slices publish (docs/dra.md).

    Slices win over GFD labels and over allocatable ``nvidia.com/gpu`` (the first GPU resource key):
    one set of GPUs is either published by the DRA driver or by the device plugin, and with the
    extended-resource mapping allocatable is zero while the slices still list every GPU.
    """
    if gpus is None or gpus.count == 0:
        return node
    meta = dict(node.get("metadata") or {})
    labels = dict(meta.get("labels") or {})
    if gpus.product and keys.gpu_product:
        for k in keys.gpu_product:
            labels.pop(k, None)
        labels[keys.gpu_product[0]] = gpus.product
    if keys.gpu_memory_mib:
        for k in keys.gpu_memory_mib:
            labels.pop(k, None)
        if gpus.memory_mib:
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
    spec = device_class.get("spec") if isinstance(device_class, dict) else None
    sels = spec.get("selectors") if isinstance(spec, dict) else None
    driver, mig = None, False
    for sel in sels if isinstance(sels, list) else []:
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if not isinstance(expr, str):
            continue
        if (m := _DRIVER_RE.search(expr)) is not None:
            driver = m.group(1)
        if (t := _TYPE_RE.search(expr)) is not None and t.group(1).lower() == "mig":
            mig = True
    return driver, mig


def _count(req: dict[str, Any]) -> tuple[int, bool]:
    if str(req.get("allocationMode") or "ExactCount") == "All":
        return 1, True
    c = req.get("count", 1)
    c = c if isinstance(c, int) and not isinstance(c, bool) else 1
    return max(0, min(c, MAX_DEVICES)), False


def _product(req: dict[str, Any]) -> str | None:
    for sel in req.get("selectors") or []:
        expr = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if isinstance(expr, str) and (m := _PRODUCT_RE.match(expr)) is not None:
            return m.group(2)
    return None


@dataclass(slots=True)
class DraIndex:
    """Everything DRA the extender knows; fed by watches, read by node facts and workload parsing."""

    driver: str = DRIVER
    enabled: bool = False  # the API exists and the slices were listed
    slices: dict[str, _Slice] = field(default_factory=dict)  # slice name -> parsed
    by_node: dict[str, set[str]] = field(default_factory=dict)  # node -> slice names
    classes: dict[str, tuple[str | None, bool]] = field(default_factory=dict)  # name -> (driver, mig)
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # ns/name -> spec+status
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)  # ns/name -> claim spec

    # --- slices -----------------------------------------------------------------------------------
    def put_slice(self, obj: dict[str, Any]) -> str | None:
        """Add or replace a slice; returns the node whose facts changed (None if none)."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        old = self.slices.pop(name, None)
        if old is not None:
            self.by_node.get(old.node, set()).discard(name)
        s = parse_slice(obj)
        if s is not None:
            self.slices[name] = s
            self.by_node.setdefault(s.node, set()).add(name)
        return s.node if s is not None else (old.node if old is not None else None)

    def drop_slice(self, name: str) -> str | None:
        old = self.slices.pop(name, None)
        if old is None:
            return None
        self.by_node.get(old.node, set()).discard(name)
        return old.node

    def gpus_of(self, node: str) -> DraNodeGpus | None:
        names = self.by_node.get(node)
        if not names:
            return None
        return node_gpus([self.slices[n] for n in sorted(names) if n in self.slices], self.driver)

    def overlay(self, node: dict[str, Any], keys: NodeLabelKeys) -> dict[str, Any]:
        name = (node.get("metadata") or {}).get("name") if isinstance(node, dict) else None
        if not self.by_node or not isinstance(name, str):
            return node
        return overlay(node, self.gpus_of(name), keys)

    def _is_mig_device(self, pool: str, device: str) -> bool:
        for s in self.slices.values():
            if s.driver == self.driver and s.pool == pool:
                for d in s.devices:
                    if d.name == device:
                        return d.mig
        return False

    # --- claims -----------------------------------------------------------------------------------
    def put_class(self, obj: dict[str, Any]) -> None:
        self.classes[str((obj.get("metadata") or {}).get("name") or "")] = class_driver(obj)

    def demand(self, claim_spec: dict[str, Any], status: dict[str, Any] | None = None) -> ClaimDemand:
        """Full GPUs of our driver a claim holds (allocated) or asks for (not yet)."""
        alloc = (status or {}).get("allocation") if isinstance(status, dict) else None
        if isinstance(alloc, dict):
            results = ((alloc.get("devices") or {}).get("results")) or []
            n = sum(1 for r in results if isinstance(r, dict) and r.get("driver") == self.driver
                    and not self._is_mig_device(str(r.get("pool")), str(r.get("device"))))
            return ClaimDemand(gpus=n, allocated=True)
        reqs = ((claim_spec.get("devices") or {}).get("requests")) if isinstance(claim_spec, dict) else None
        total, product, every = 0, None, False
        for req in reqs if isinstance(reqs, list) else []:
            if not isinstance(req, dict):
                continue
            # firstAvailable: kube-scheduler tries the alternatives in order; count the first one
            # of a full-GPU class (a lower count later in the list can only free devices).
            options = [req["exactly"]] if isinstance(req.get("exactly"), dict) else \
                [o for o in req.get("firstAvailable") or [] if isinstance(o, dict)]
            if not options and "deviceClassName" in req:
                options = [req]  # v1beta1-shaped request
            for opt in options:
                driver, mig = self.classes.get(str(opt.get("deviceClassName")), (None, False))
                if driver != self.driver or mig:
                    continue
                c, all_mode = _count(opt)
                total += c
                every = every or all_mode
                product = product or _product(opt)
                break
        return ClaimDemand(gpus=min(total, MAX_DEVICES), product=product, all_devices=every)

    def put_claim(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        self.claims[key] = {"spec": obj.get("spec") or {}, "status": obj.get("status") or {}}

    def put_template(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        self.templates[key] = ((obj.get("spec") or {}).get("spec")) or {}

    def pod_gpus(self, pod: dict[str, Any]) -> int:
        """Full GPUs a pod's claims hold or ask for (0 when it has none or DRA is not in use)."""
        spec = pod.get("spec") if isinstance(pod, dict) else None
        refs = spec.get("resourceClaims") if isinstance(spec, dict) else None
        if not refs or not isinstance(refs, list):
            return 0
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        generated: dict[str, str] = {}
        for st in ((pod.get("status") or {}).get("resourceClaimStatuses") or []):
            if isinstance(st, dict) and isinstance(st.get("resourceClaimName"), str):
                generated[str(st.get("name"))] = st["resourceClaimName"]
        total = 0
        for ref in refs[:MAX_DEVICES]:
            if not isinstance(ref, dict):
                continue
            claim_name = ref.get("resourceClaimName") or generated.get(str(ref.get("name")))
            if isinstance(claim_name, str) and (c := self.claims.get(f"{ns}/{claim_name}")) is not None:
                total += self.demand(c["spec"], c["status"]).gpus
            elif isinstance(ref.get("resourceClaimTemplateName"), str):
                tmpl = self.templates.get(f"{ns}/{ref['resourceClaimTemplateName']}")
                if tmpl is not None:
                    total += self.demand(tmpl).gpus
        return min(total, MAX_DEVICES)
