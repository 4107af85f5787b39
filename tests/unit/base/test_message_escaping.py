"""User-chosen names in event and reason messages: escaped and bounded, never a second line.

A gang name, a producer or an annotation value is free text (annotation values may hold newlines, NUL,
terminal escape sequences, bidi overrides). Quoted raw, ``gang x\\nSuccessfully assigned ...`` forges a
line in ``kubectl describe`` and ESC sequences rewrite the reader's terminal.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from app.api import wire
from app.base.objects import pod_object
from app.base.reasons import MESSAGE_CHARS, SHOWN_CHARS, ReasonCode, reject, shown
from app.base.workload import PREFIX, WorkloadError, parse_workload
from app.cluster.binder import Binder
from tests.unit.gang.test_gang_coordinator import Cluster

EVIL = "g\nSuccessfully assigned ml/x to node-7\r\x00\x1b[2J\u202eevil\u200b\\n" + "x" * 200


def clean(message: str) -> bool:
    return message.isprintable() and "\x1b" not in message


def test_shown_escapes_repr_style_and_caps_the_length() -> None:
    s = shown(EVIL)
    assert clean(s) and len(s) <= SHOWN_CHARS + len(f"...({len(EVIL)} chars)")
    assert s.startswith("g\\nSuccessfully assigned ml/x to node-7\\r\\x00\\x1b[2J\\u202eevil\\u200b\\\\n")
    assert s.endswith(f"...({len(EVIL)} chars)")
    assert shown("plain-name") == "plain-name"
    # A backslash is doubled, so a name cannot fake an escape of something it does not contain.
    assert shown("a\\x00") == "a\\\\x00"


def test_gang_name_in_events_is_escaped_and_bounded() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    pods = []
    for i in range(2):
        pod = pod_object(f"m-{i}", namespace="ml", stage="pretraining", gpus=8,
                         annotations={PREFIX + "gang-name": EVIL, PREFIX + "gang-size": "2"})
        c.add(pod)
        pods.append(pod)
    assert len(c.filter(pods[0]).passed) == 1
    c.flush()
    planned = [m for _, r, m in c.binder.events if r == "GangPlanned"]
    assert planned and all(clean(m) for m in planned)
    assert "gang ml/g\\nSuccessfully assigned" in planned[0] and "x" * 150 not in planned[0]


def test_gang_name_in_filter_reasons_is_escaped() -> None:
    c = Cluster()
    c.nodes("n", 2, "leaf-1")
    # No size anywhere: the reason names the gang (and the PodGroup to create).
    pod = pod_object("p", namespace="ml", gpus=8, annotations={"scheduling.k8s.io/group-name": EVIL})
    c.add(pod)
    reasons = set(c.filter(pod).unresolvable.values())
    assert len(reasons) == 1
    (reason,) = reasons
    assert clean(reason) and len(reason) <= MESSAGE_CHARS and "has no size" in reason
    assert "gang ml/g\\nSuccessfully" in reason


@pytest.mark.parametrize(("key", "value"), [
    ("model-params", "7\x00B"), ("stage", "serving\n\x1b[31mfake"), ("context-tokens", "1\x002"),
    ("model", "llama\u202e"),
])
def test_bad_annotation_values_are_quoted_escaped(key: str, value: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        parse_workload(pod_object("p", annotations={PREFIX + key: value}))
    assert all(clean(p) for p in exc.value.problems), exc.value.problems


def test_every_rejection_and_wire_error_is_one_line() -> None:
    # Whatever a message quotes, the last step before kube-scheduler escapes it.
    assert clean(reject(ReasonCode.OTHER, "a\nb\x00").message)
    assert clean(orjson.loads(wire.binding_result("gang a\nb"))["Error"])
    assert clean(orjson.loads(wire.filter_result(None, [], {}, {}, "a\nb"))["Error"])
    assert orjson.loads(wire.binding_result(""))["Error"] == ""


def test_events_written_to_the_api_server_are_one_line() -> None:
    posted: list[dict[str, Any]] = []

    class Rest:
        def request(self, method: str, path: str, body: Any = None, **_: Any) -> bytes:
            posted.append(body)
            return b"{}"

    binder = Binder(cast(Any, None), rest=Rest())
    binder.event("ml", "p", "u", "ProducerNotFound", "producer a\nb\x1b[2J" + "y" * 5000, warning=True)
    assert binder.flush()
    message = posted[0]["message"]
    assert clean(message) and "a\\nb\\x1b[2J" in message and len(message) <= 1024
