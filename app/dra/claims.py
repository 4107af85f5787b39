"""ResourceClaims and ResourceClaimTemplates as they are, and the devices of the driver allocated
claims hold (``ClaimBook``): a device nobody holds is free (docs/dra.md, "Free GPUs", "MIG"). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.dra.devices import DRIVER, MAX_DEVICES

Device = tuple[str, str]  # (pool, device name)


def holds_device(result: Any, driver: str) -> bool:
    """Does this allocation result take a device of ``driver``? Not with admin access: kube-scheduler
    gives admin-access requests devices whether or not they are in use, and they stay usable by others
    (monitoring, debugging), so such a result is not a used GPU."""
    return (isinstance(result, dict) and result.get("driver") == driver
            and result.get("adminAccess") is not True)


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


@dataclass(slots=True)
class ClaimBook:
    """Claims and templates by ns/name, and who holds which device of the driver. Changes return
    the devices taken or given back; which nodes those are is the slices' to say."""

    driver: str = DRIVER
    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # ns/name -> spec+status
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)  # ns/name -> claim spec
    # (pool, device) of the driver -> claims holding it (from status.allocation): MIG slices free
    # on a node are the published ones nobody holds (docs/dra.md, "MIG").
    held: dict[Device, set[str]] = field(default_factory=dict)
    claim_devices: dict[str, tuple[Device, ...]] = field(default_factory=dict)

    def put(self, obj: dict[str, Any]) -> set[Device]:
        """Add or replace a claim; returns the devices it took or gave back."""
        key = _key(obj)
        status = obj.get("status") or {}
        self.claims[key] = {"spec": obj.get("spec") or {}, "status": status}
        alloc = status.get("allocation") if isinstance(status, dict) else None
        results = ((alloc.get("devices") or {}).get("results") or []) if isinstance(alloc, dict) else []
        devices = tuple((str(r.get("pool")), str(r.get("device"))) for r in
                        (results if isinstance(results, list) else [])[:MAX_DEVICES]
                        if holds_device(r, self.driver))
        return self._hold(key, devices)

    def drop(self, key: str) -> set[Device]:
        self.claims.pop(key, None)
        return self._hold(key, ())

    def _hold(self, key: str, devices: tuple[Device, ...]) -> set[Device]:
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
        return set(old) ^ set(devices)

    def clear(self) -> set[Device]:
        """Forget every claim; returns the devices they held."""
        devices = set(self.held)
        self.claims.clear()
        self.held.clear()
        self.claim_devices.clear()
        return devices

    def put_template(self, obj: dict[str, Any]) -> None:
        self.templates[_key(obj)] = ((obj.get("spec") or {}).get("spec")) or {}

    def is_allocated(self, key: str) -> bool:
        status = (self.claims.get(key) or {}).get("status")
        return isinstance(status, dict) and isinstance(status.get("allocation"), dict)
