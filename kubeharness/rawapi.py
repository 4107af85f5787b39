"""The official client as the harness uses it: JSON objects in, raw JSON out.

The harness writes its objects as plain dicts (the manifests docs/ and the chart show) and reads
answers as JSON, because the generated model classes cost far more than the requests themselves
when a benchmark creates thousands of objects. The client's signatures name its model classes for
both, although its serializer sends a dict body as it is and ``_preload_content=False`` returns the
urllib3 response undecoded; these helpers state that once, with types, instead of at every call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

T = TypeVar("T")


class RawResponse(Protocol):
    """What ``_preload_content=False`` returns (a urllib3 response): the body, unread until asked."""

    @property
    def data(self) -> bytes: ...

    def release_conn(self) -> None: ...


def call(method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a client method whose body is a JSON object (a dict), keeping its answer's type."""
    return method(*args, **kwargs)


def send(method: Callable[..., object], *args: Any, **kwargs: Any) -> RawResponse:
    """Call a client method with ``_preload_content=False``: the answer is the undecoded response."""
    return cast(RawResponse, method(*args, _preload_content=False, **kwargs))


def read_json(method: Callable[..., object], *args: Any, **kwargs: Any) -> Any:
    """Call a client method and decode its answer's body as JSON (an object, for every API read)."""
    return json.loads(send(method, *args, **kwargs).data)


def json_object(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object: what CustomObjectsApi answers are, typed only as ``object``."""
    if not isinstance(value, dict):
        raise TypeError(f"{what}: expected a JSON object, got {type(value).__name__}")
    return value


def items(value: object, what: str) -> list[dict[str, Any]]:
    """The ``items`` of a list answer (CustomObjectsApi's, typed only as ``object``)."""
    return list(json_object(value, what)["items"])
