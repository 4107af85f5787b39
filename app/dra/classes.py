"""DeviceClasses of the driver, and the extended resources they back (DRAExtendedResource): a
container's ``example.com/gpu: 2`` that kube-scheduler turns into a claim of the backing class
(docs/dra.md). Pure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from app.base.units import parse_quantity
from app.dra.devices import DRIVER, MAX_DEVICES, as_dict
from app.dra.selectors import Selection, class_selection, devices_of

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"  # every DeviceClass's implicit resource name


def _requested(container: Any, resource: str) -> int:
    """A container's request (or, for an extended resource, its limit) of ``resource``."""
    res = as_dict(as_dict(container).get("resources"))
    raw = as_dict(res.get("requests")).get(resource, as_dict(res.get("limits")).get(resource))
    try:
        return max(0, min(int(parse_quantity(raw)), MAX_DEVICES)) if raw is not None else 0
    except (ValueError, TypeError):
        return 0


@dataclass(slots=True)
class DeviceClasses:
    """What each DeviceClass selects, and which class each extended resource name stands for."""

    driver: str = DRIVER
    classes: dict[str, Selection] = field(default_factory=dict)  # name -> what it selects
    extended: dict[str, str] = field(default_factory=dict)  # spec.extendedResourceName -> class

    def put(self, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        self.drop(name)
        self.classes[name] = class_selection(obj)
        ext = as_dict(obj.get("spec")).get("extendedResourceName")
        if isinstance(ext, str) and ext:
            self.extended[ext] = name

    def drop(self, name: str) -> None:
        self.classes.pop(name, None)
        for ext in [e for e, c in self.extended.items() if c == name]:
            del self.extended[ext]

    def clear(self) -> None:
        self.classes.clear()
        self.extended.clear()

    def of_driver(self, name: Any) -> Selection | None:
        """The class ``name`` when it is one of the driver's (None: unknown, or another driver's)."""
        cls = self.classes.get(str(name))
        return cls if cls is not None and cls.driver == self.driver else None

    def _gpu_resource_class(self, resource: Any) -> bool:
        """Does the extended resource name a full-GPU class of the driver? Either a class's
        ``spec.extendedResourceName`` or the implicit ``deviceclass.resource.kubernetes.io/<class>``."""
        cls = self._backing_class(resource) if isinstance(resource, str) else None
        return cls is not None and devices_of(cls) == "gpu"

    def _backing_class(self, resource: str) -> Selection | None:
        """The DeviceClass of the driver an extended resource name stands for (None: none)."""
        name = resource[len(IMPLICIT_PREFIX):] if resource.startswith(IMPLICIT_PREFIX) \
            else self.extended.get(resource)
        cls = self.classes.get(name) if name else None
        return cls if cls is not None and cls.driver == self.driver else None

    def extended_requests(self, pod: dict[str, Any]) -> list[tuple[str, int, Selection]]:
        """(resource, devices, class) per extended resource of the pod's containers that a
        DeviceClass of the driver backs (kube-scheduler turns them into a claim of that class):
        the sum over containers, or the largest init container's if that is more."""
        if not self.extended and not self.classes:
            return []
        spec = as_dict(pod.get("spec")) if isinstance(pod, dict) else {}
        regular: Counter[str] = Counter()
        init: Counter[str] = Counter()
        for which, into in (("containers", regular), ("initContainers", init)):
            containers = spec.get(which)
            for c in (containers if isinstance(containers, list) else [])[:MAX_DEVICES]:
                res = as_dict(as_dict(c).get("resources"))
                for name in set(as_dict(res.get("requests"))) | set(as_dict(res.get("limits"))):
                    if isinstance(name, str) and "/" in name and self._backing_class(name) is not None:
                        n = _requested(c, name)
                        into[name] = into[name] + n if into is regular else max(into[name], n)
        out = []
        for name in sorted(set(regular) | set(init)):
            cls = self._backing_class(name)
            n = max(regular[name], init[name])
            if cls is not None and n and devices_of(cls) is not None:
                out.append((name, min(n, MAX_DEVICES), cls))
        return out

    def extended_claim(self, pod: dict[str, Any]) -> tuple[str, int] | None:
        """(ns/name, full GPUs) of the claim kube-scheduler made for the pod's extended resources
        (``status.extendedResourceClaimStatus``): the GPUs of the container requests it maps to a
        full-GPU class of the driver. They are counted as extended resources already; once the
        claim is allocated its devices count on the node instead."""
        st = (pod.get("status") or {}).get("extendedResourceClaimStatus") if isinstance(pod, dict) else None
        if not isinstance(st, dict) or not isinstance(st.get("resourceClaimName"), str):
            return None
        spec = as_dict(pod.get("spec"))
        ns = str(as_dict(pod.get("metadata")).get("namespace") or "default")
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
