"""After an API server outage the watches reconnect within a couple of seconds (app/cluster/backoff.py).

The watch loops run against a fake API server on a virtual clock: every wait of the loop advances the
clock instead of sleeping, so an outage of a minute takes no time and the delays are exact. With the
old schedule (0.5 s doubling to 30 s, reset only after a whole watch period) a 20 s outage left new
pods unseen for 11.5 s after the API server was back.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.ratelog import RateLimitedLog
from app.cluster.backoff import CAP_SECONDS, INITIAL_SECONDS, Backoff
from app.cluster.cache import ClusterCache
from app.config.settings import Settings
from app.gang.kube import PodGroupWatcher
from app.metrics.metrics import Metrics
from app.snapshot.store import ClusterSnapshot


def test_delays_double_with_jitter_up_to_a_low_cap_and_restart_after_success() -> None:
    high, low = Backoff(rand=lambda: 1.0), Backoff(rand=lambda: 0.0)
    highs = [high.next() for _ in range(12)]
    lows = [low.next() for _ in range(12)]
    assert highs[:5] == [0.25, 0.5, 1.0, 2.0, 2.0]
    assert lows[:5] == [0.125, 0.25, 0.5, 1.0, 1.0]  # jitter: somewhere in the upper half
    assert max(highs) == CAP_SECONDS <= 5
    # Over a minute-long outage the API server is retried at least every CAP_SECONDS.
    assert all(d <= CAP_SECONDS for d in highs)
    high.reset()
    assert high.next() == INITIAL_SECONDS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0


class VirtualStop:
    """The loop's stop event: ``wait`` advances the virtual clock and records the delay."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.flag, self.waits = clock, False, list[float]()

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        self.clock.now += float(timeout or 0)
        return self.flag


class Stream:
    """A response: ``data`` for a list, ``stream()`` for a watch (which may break at its end)."""

    def __init__(self, lines: list[bytes], broken: bool = False) -> None:
        self.lines, self.broken = lines, broken
        self.data = b"".join(lines)

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.lines
        if self.broken:
            raise ConnectionResetError("connection reset by peer")

    def release_conn(self) -> None:
        pass


# The API server goes away for 20 s, comes back, then goes away again for 0.1 s.
FIRST_OUTAGE = (1.0, 21.0)
SECOND_OUTAGE = (26.0, 26.1)


def _down(now: float) -> bool:
    return any(start <= now < end for start, end in (FIRST_OUTAGE, SECOND_OUTAGE))


def test_pod_created_during_an_outage_is_seen_soon_after_it_ends(settings: Settings,
                                                                 catalog: GpuCatalog) -> None:
    clock = Clock()
    stop = VirtualStop(clock)
    late = pod_object("late", gpus=1, uid="uid-late")  # created while the API server was away
    late["spec"]["nodeName"] = "g"
    seen: dict[str, float] = {}

    class Core:
        def list_pod_for_all_namespaces(self, watch: bool = False, **_: Any) -> Stream:
            if _down(clock.now):
                raise ConnectionRefusedError("connection refused")
            if not watch:
                return Stream([json.dumps({"metadata": {"resourceVersion": "10"}, "items": []}).encode()])
            if "late" not in seen and clock.now < FIRST_OUTAGE[0]:
                clock.now = FIRST_OUTAGE[0]  # the outage starts: the open watch breaks
                return Stream([], broken=True)
            if "late" not in seen:
                seen["late"] = clock.now
                clock.now = SECOND_OUTAGE[0]  # some time later, the second outage breaks it
                event = {"type": "ADDED", "object": late}
                return Stream([json.dumps(event).encode() + b"\n"], broken=True)
            seen["again"] = clock.now
            stop.set()
            return Stream([])

    snapshot = ClusterSnapshot()
    cache = ClusterCache(object(), snapshot, threading.RLock(), catalog, settings,  # type: ignore[arg-type]
                         Metrics())
    cache._apply_node(node_object("g", gpus=8, product="NVIDIA-L4"))
    cache.core = Core()  # type: ignore[assignment]
    cache._stop = stop  # type: ignore[assignment]
    cache._run("pods")

    assert "uid-late" in snapshot.pods
    assert seen["late"] - FIRST_OUTAGE[1] <= CAP_SECONDS, stop.waits
    assert max(stop.waits) <= CAP_SECONDS
    # The watch the API server accepted reset the delay: the short second outage cost a first step.
    assert seen["again"] - SECOND_OUTAGE[0] <= INITIAL_SECONDS, stop.waits


def test_podgroup_watch_reconnects_soon_after_an_outage() -> None:
    clock = Clock()
    stop = VirtualStop(clock)
    lists: list[float] = []  # when the API server was reached again: a list or a resumed watch

    class Custom:
        def list_cluster_custom_object(self, *args: Any, watch: bool = False, **_: Any) -> Stream:
            if _down(clock.now):
                raise ConnectionRefusedError("connection refused")
            lists.append(clock.now)
            if clock.now >= FIRST_OUTAGE[1]:
                stop.set()
            if not watch:
                return Stream([json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()])
            clock.now = max(clock.now, FIRST_OUTAGE[0])  # the outage starts: the open watch breaks
            return Stream([], broken=True)

    def raw(fn: Any, *args: Any, **kw: Any) -> bytes:
        return bytes(fn(*args, **kw).data)

    watcher = PodGroupWatcher(Custom(), raw, ClusterSnapshot(), threading.RLock())  # type: ignore[arg-type]
    watcher._stop = stop  # type: ignore[assignment]
    watcher._run()
    assert lists[-1] - FIRST_OUTAGE[1] <= CAP_SECONDS, lists
    assert max(stop.waits) <= CAP_SECONDS


@pytest.mark.parametrize("seed", range(5))
def test_jitter_spreads_retries(seed: int) -> None:
    import random

    rng = random.Random(seed)
    delays = [Backoff(rand=rng.random).next() for _ in range(50)]
    assert len({round(d, 6) for d in delays}) > 1  # not in lockstep
    assert all(INITIAL_SECONDS / 2 <= d <= INITIAL_SECONDS for d in delays)


def _refusing(until: float, clock: Clock, stop: VirtualStop, lists: list[float],
              status: int = 403) -> Any:
    """A custom-objects API that answers ``status`` until ``until`` (virtual s), then serves lists."""
    from kubernetes.client.exceptions import ApiException

    class Custom:
        def list_cluster_custom_object(self, *args: Any, watch: bool = False, **_: Any) -> Stream:
            if clock.now < until:
                raise ApiException(status=status, reason="Forbidden" if status == 403 else "Not Found")
            if not watch:
                lists.append(clock.now)
                stop.set()
                return Stream([json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()])
            return Stream([])

    return Custom()


def test_a_refusal_while_the_api_server_starts_is_looked_at_again_within_seconds() -> None:
    # Right after a restart kube-apiserver's authorizer can answer 403 for a moment. Waiting the
    # full minute before the next look left the extender blind to the API for that minute (seen in
    # CI: DRA device classes taken as absent after the API server restart test).
    from app.cluster.dra import DraWatcher

    for make in ("podgroups", "dra"):
        clock = Clock()
        stop = VirtualStop(clock)
        lists: list[float] = []
        custom = _refusing(1.5, clock, stop, lists)
        if make == "podgroups":
            def raw(fn: Any, *args: Any, **kw: Any) -> bytes:
                return bytes(fn(*args, **kw).data)

            pg = PodGroupWatcher(custom, raw, ClusterSnapshot(), threading.RLock())
            pg._stop = stop  # type: ignore[assignment]
            pg._run()
        else:
            dra = DraWatcher.__new__(DraWatcher)  # only the list loop: no cache, no nodes
            dra._stop, dra.present = stop, {}  # type: ignore[assignment]
            dra._log = RateLimitedLog(logging.getLogger(__name__))
            dra.cache = ClusterCache.__new__(ClusterCache)
            dra.cache.metrics = Metrics()
            dra._list = lambda kind, api=custom: (api.list_cluster_custom_object() and [], "1")  # type: ignore[method-assign]
            dra._replace = lambda kind, items: None  # type: ignore[method-assign]
            dra._listed = lambda kind: None  # type: ignore[method-assign]
            dra._notify = lambda: None  # type: ignore[method-assign]
            dra._open_watch = lambda kind, rv: Stream([])  # type: ignore[method-assign]
            dra._run("deviceclasses")
        assert lists, make
        assert lists[0] - 1.5 <= 2.0, (make, stop.waits)


def test_an_api_that_stays_absent_is_looked_at_at_most_every_minute_after_the_first_tries() -> None:
    clock = Clock()
    stop = VirtualStop(clock)
    lists: list[float] = []
    custom = _refusing(3600.0, clock, stop, lists, status=404)

    def raw(fn: Any, *args: Any, **kw: Any) -> bytes:
        return bytes(fn(*args, **kw).data)

    pg = PodGroupWatcher(custom, raw, ClusterSnapshot(), threading.RLock())
    pg._stop = stop  # type: ignore[assignment]
    pg._run()  # ends at the first list the API serves, after the virtual hour
    looks = len(stop.waits)
    # Between once and twice a minute over the hour (jitter picks in the upper half of the delay).
    assert 60 <= looks <= 130, stop.waits
    assert max(stop.waits) <= 60.0 and stop.waits[0] <= 1.0
