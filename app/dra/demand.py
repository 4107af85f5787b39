"""What a claim asks for or holds (``ClaimDemand``), and a pod's devices of the driver through its
claims and the extended resources a DeviceClass backs (``ClaimedDevices``, the fields a WorkloadSpec
carries them in), read by ``DemandReader`` (docs/dra.md). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from app.base.workload import ClaimedDevices
from app.dra.claims import ClaimBook, holds_device
from app.dra.classes import DeviceClasses
from app.dra.devices import MAX_DEVICES, as_dict
from app.dra.selectors import (
    MAX_PREDICATES,
    DevicePredicate,
    Selection,
    device_satisfies,
    devices_of,
    read_selectors,
)
from app.dra.slices import SliceStore, current


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


@dataclass(slots=True)
class DeviceMatcher:
    """Device predicates (on attributes and capacities other than product and memory) turned into
    the products or MIG profiles that have a device satisfying them, among those published."""

    store: SliceStore
    _cache: dict[Any, tuple[str, ...]] = field(default_factory=dict)

    def resolve(self, sel: Selection, mig: bool) -> Selection:
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
        key = (preds, mig, self.store.version)
        if (hit := self._cache.get(key)) is not None:
            return hit
        found = set()
        driver = self.store.driver
        for node in self.store.by_node:
            for _, d in current(self.store.node_slices(node), driver):
                name = d.profile if mig else d.product
                if name and (d.mig if mig else d.full) and device_satisfies(d, preds, driver):
                    found.add(name)
        if len(self._cache) > MAX_DEVICES:
            self._cache.clear()
        self._cache[key] = got = tuple(sorted(found))
        return got


@dataclass(slots=True)
class DemandReader:
    """Claims and pods read against the device classes, the claims and templates as they are, and
    the devices published."""

    store: SliceStore
    book: ClaimBook
    classes: DeviceClasses
    matcher: DeviceMatcher = field(init=False)

    def __post_init__(self) -> None:
        self.matcher = DeviceMatcher(self.store)

    @property
    def driver(self) -> str:
        return self.store.driver

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
                cls = self.classes.of_driver(opt.get("deviceClassName"))
                if cls is None:
                    continue
                sel = cls.merge(read_selectors(opt.get("selectors"), self.driver))
                c, all_mode = _count(opt)
                if devices_of(sel) == "mig":
                    mig_total += c
                    if not first:
                        mig_sel = mig_sel.merge(self.matcher.resolve(sel, mig=True))
                elif devices_of(sel) is None:
                    pass  # vfio.gpu.nvidia.com: a GPU passed through to a VM, no container GPU
                else:
                    total += c
                    shares += c if as_dict(as_dict(opt.get("capacity")).get("requests")) else 0
                    every = every or all_mode
                    product = product or _product(sel)
                    if not first:
                        full_sel = full_sel.merge(self.matcher.resolve(sel, mig=False))
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
            if not holds_device(r, self.driver):
                continue
            d = self.store.device(str(r.get("pool")), str(r.get("device")))
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
            if key is not None and (c := self.book.claims.get(key)) is not None:
                out.append((key, self.demand(c["spec"], c["status"])))
            elif isinstance(ref.get("resourceClaimTemplateName"), str):
                tmpl = self.book.templates.get(f"{ns}/{ref['resourceClaimTemplateName']}")
                if tmpl is not None:
                    out.append((None, self.demand(tmpl)))
        return out

    def pod_gpus(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> int:
        """Full GPUs a pod's claims hold or ask for, plus those its containers ask for as extended
        resources a DeviceClass of the driver backs and ``counted`` (the extended resources read as
        GPUs anyway) leaves out. 0 when it has none or DRA is not in use."""
        ext = sum(n for name, n, cls in self.classes.extended_requests(pod)
                  if name not in counted and devices_of(cls) == "gpu")
        return min(sum(d.gpus for _, d in self._claim_demands(pod)) + ext, MAX_DEVICES)

    def pod_devices(self, pod: dict[str, Any], counted: tuple[str, ...] = ()) -> ClaimedDevices:
        """Everything a pod's claims (and extended resources backed by a DeviceClass) say beyond
        the full-GPU count: MIG slices, the restrictions of recognised selectors, the selectors left
        to kube-scheduler, and which claims hold or ask for how many full GPUs (docs/dra.md)."""
        keyed = self._claim_demands(pod)
        ext = self.classes.extended_claim(pod)
        backed = [(name, n, cls) for name, n, cls in self.classes.extended_requests(pod)
                  if name not in counted]
        if not keyed and ext is None and not backed:
            return ClaimedDevices()
        full, migs = Selection(), Selection()
        mig = 0
        for _, n, cls in backed:
            if devices_of(cls) == "mig":
                mig += n
                migs = migs.merge(self.matcher.resolve(cls, mig=True))
            else:
                full = full.merge(self.matcher.resolve(cls, mig=False))
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
        mig = min(mig, MAX_DEVICES)
        gb = 1.048576 / 1000.0  # MiB -> GB, as node facts count memory
        return ClaimedDevices(
            gpu_products=full.products[:MAX_PREDICATES], gpu_min_memory_gb=full.min_memory_mib * gb,
            # A MIG restriction means nothing without a MIG slice to apply to.
            mig_slices=mig, mig_profiles=(migs.profiles or ()) if mig else (),
            mig_min_memory_gb=migs.min_memory_mib * gb if mig else 0.0,
            claim_notes=tuple(f"selector not interpreted, left to kube-scheduler: {n}" for n in notes),
            claim_gpus=tuple(claims[:MAX_DEVICES]),
            held_gpus=min(sum(n for k, n in claims if self.book.is_allocated(k)), MAX_DEVICES),
            shared_gpus=min(sum(d.shares for _, d in keyed), MAX_DEVICES))
