"""The one list+watch loop (app/cluster/reflector.py): resume after a watch ends, re-list after 410 Gone,
bookmarks move the version, one unreadable event costs only itself, absent APIs are said once."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from kubernetes.client.exceptions import ApiException

from app.base.ratelog import RateLimitedLog
from app.cluster.reflector import Reflector
from tests.unit.cluster.test_watch_backoff import Clock, Stream, VirtualStop


def _event(etype: str, name: str, rv: str, **extra: Any) -> bytes:
    obj = {"metadata": {"name": name, "resourceVersion": rv}, **extra}
    return json.dumps({"type": etype, "object": obj}).encode() + b"\n"


def run(watches: list[Any], lists: list[tuple[list[dict[str, Any]], str]], absent: list[int] | None = None
        ) -> dict[str, Any]:
    """Run a reflector over scripted lists and watches; stops when the script is used up."""
    stop = VirtualStop(Clock())
    got: dict[str, Any] = {"lists": 0, "watch_from": [], "applied": [], "replaced": [], "skipped": 0,
                           "restarts": []}

    def list_objects() -> tuple[list[dict[str, Any]], str]:
        got["lists"] += 1
        if not lists:
            stop.set()
            return [], "0"
        return lists.pop(0)

    def open_watch(rv: str) -> Any:
        got["watch_from"].append(rv)
        if not watches:
            stop.set()
            return Stream([])
        w = watches.pop(0)
        if isinstance(w, Exception):
            raise w
        return w

    def skipped(obj: Any, exc: Exception) -> None:
        got["skipped"] += 1

    def apply(etype: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "poison":
            raise ValueError("unreadable")
        got["applied"].append((etype, obj["metadata"]["name"]))

    Reflector("things", list_objects=list_objects, open_watch=open_watch,
              replace=lambda items: got["replaced"].append([i["metadata"]["name"] for i in items]),
              apply=apply, stop=stop, log=RateLimitedLog(logging.getLogger(__name__)), skipped=skipped,
              on_absent=(lambda status: absent.append(status)) if absent is not None else None,
              restarted=got["restarts"].append).run()
    return got


def test_a_watch_that_ends_is_resumed_from_the_last_version_not_listed_again() -> None:
    got = run([Stream([_event("ADDED", "a", "11"), _event("BOOKMARK", "", "15")]),
               Stream([_event("DELETED", "a", "16")])],
              [([{"metadata": {"name": "x"}}], "10")])
    assert got["watch_from"][:3] == ["10", "15", "16"]  # the bookmark moved the version
    assert got["replaced"] == [[ "x"]] and got["lists"] == 1
    assert got["applied"] == [("ADDED", "a"), ("DELETED", "a")]


def test_gone_lists_again_and_is_counted() -> None:
    gone = json.dumps({"type": "ERROR", "object": {"code": 410, "message": "too old"}}).encode() + b"\n"
    got = run([Stream([gone]), ApiException(status=410)], [([], "10"), ([], "20"), ([], "30")])
    assert got["watch_from"][:3] == ["10", "20", "30"]
    assert got["restarts"][:2] == ["gone", "gone"]


def test_one_unreadable_event_costs_only_itself() -> None:
    got = run([Stream([b"{not json\n", _event("ADDED", "poison", "11"), _event("ADDED", "b", "12")])],
              [([], "10")])
    assert got["applied"] == [("ADDED", "b")]
    assert got["skipped"] == 2
    assert got["watch_from"][1] == "12"


def test_an_absent_api_is_reported_and_looked_at_again_and_other_errors_retried() -> None:
    absent: list[int] = []
    got = run([ApiException(status=404), ApiException(status=500)], [([], "1"), ([], "2")], absent)
    assert absent == [404]
    assert got["lists"] >= 2  # after the 404 the kind is listed again
    assert "error" in got["restarts"]
    # Without on_absent a 403/404 is an error like any other: retried, never treated as absent.
    got = run([ApiException(status=403)], [([], "1")])
    assert got["restarts"][0] == "error"


def test_stop_ends_the_loop() -> None:
    stop = threading.Event()
    stop.set()
    Reflector("x", list_objects=lambda: ([], "1"), open_watch=lambda rv: Stream([]), replace=lambda i: None,
              apply=lambda e, o: None, stop=stop, log=RateLimitedLog(logging.getLogger(__name__)),
              skipped=lambda o, e: None).run()
