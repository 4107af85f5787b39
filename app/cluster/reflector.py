"""One list+watch loop for every kind the extender follows (nodes, pods, namespaces, the DRA objects,
PodGroups): what kube's client-go calls a reflector (docs/extender-protocol.md, "Cache mode and
restarts").

* List, hand the items to ``replace``, then watch from the list's resourceVersion; each event goes
  to ``apply``. A watch that ends (the API server's timeout) is resumed from the last version seen,
  bookmarks included, so nothing is listed again.
* 410 Gone (an ERROR event or an HTTP error) means the version is too old: list again.
* An API the cluster does not serve (404) or does not let us read (403), for kinds that may be
  absent (``on_absent``): said once, looked at again soon and then at most every minute
  (app/cluster/backoff.py); the owner reads the cluster without it meanwhile.
* Anything else (connection refused, a broken stream): retried after a short, jittered delay that
  resets as soon as the API server answers, so objects created during an outage are seen within
  seconds of its end.
* One unreadable event or object costs only itself (``skipped``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from app.base.ratelog import RateLimitedLog
from app.base.units import quote
from app.cluster.backoff import Backoff, absent_backoff

Obj = dict[str, Any]
WATCH_SECONDS = 240  # the API server ends each watch after this; the reflector resumes it
READ_TIMEOUT = (10, 300)  # (connect, read) seconds of one watch request


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): re-list."""


def watch_events(resp: Any, stop: threading.Event, unreadable: Callable[[Exception], None]
                 ) -> Iterator[tuple[str, Obj]]:
    """(type, object) for each event of a watch stream, until ``stop``.

    An unreadable line costs only itself: it goes to ``unreadable`` and the stream goes on.
    """
    for line in resp_lines(resp):
        if stop.is_set():
            return
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
            etype, obj = str(event.get("type")), event.get("object") or {}
            if not isinstance(obj, dict):
                raise TypeError(f"watch event object is {type(obj).__name__}, not an object")
        except Exception as exc:
            unreadable(exc)
            continue
        yield etype, obj


def resp_lines(resp: Any) -> Iterator[bytes]:
    """The lines of a streamed response, as bytes (the parser reads UTF-8 bytes directly).

    Every pod change the cluster makes arrives here, several KB each: the client's own line reader
    decoded each line to text and copied the rest of its buffer per line, and the standard JSON
    parser then read the text; this splits each chunk once and hands bytes to orjson.
    """
    rest = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8")
        if b"\n" not in chunk:
            rest += chunk
            continue
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    # A stream cut mid-line (the connection broke) leaves an incomplete event: dropped, as the
    # client's reader drops it; the watch resumes from the last complete one.


class Reflector:
    """List and watch one kind into its owner, until ``stop``.

    ``list_objects()``: every item and the list's resourceVersion. ``open_watch(rv)``: the streaming
    watch response from ``rv``. ``replace(items)``: the owner's state becomes the list. ``apply(type,
    obj)``: one ADDED/MODIFIED/DELETED event. ``listed()``: after every list (and after the API was
    found absent). ``on_absent(status)``: the kind may be absent; return nothing. ``restarted(cause)``:
    a watch stream started over ("gone" or "error"), for the metrics.
    """

    def __init__(
        self,
        label: str,
        *,
        list_objects: Callable[[], tuple[list[Obj], str]],
        open_watch: Callable[[str], Any],
        replace: Callable[[list[Obj]], None],
        apply: Callable[[str, Obj], None],
        stop: threading.Event,
        log: RateLimitedLog,
        skipped: Callable[[Obj | None, Exception], None],
        listed: Callable[[], None] | None = None,
        on_absent: Callable[[int], None] | None = None,
        restarted: Callable[[str], None] | None = None,
    ) -> None:
        self.label = label
        self._list, self._open, self._replace, self._apply = list_objects, open_watch, replace, apply
        self._stop, self._log, self._skipped = stop, log, skipped
        self._listed, self._on_absent, self._restarted = listed, on_absent, restarted

    def run(self) -> None:
        backoff = Backoff()  # short and reset when the API server answers (app/cluster/backoff.py)
        absent = absent_backoff()  # 403/404: soon at first, then every minute (app/cluster/backoff.py)
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    items, listed_rv = self._list()
                    backoff.reset()
                    absent.reset()
                    self._replace(items)
                    # Only now: a watch resumed from this version must not skip objects that were
                    # listed but never applied.
                    rv = listed_rv
                    if self._listed is not None:
                        self._listed()
                rv = self._watch(rv, backoff)
            except Gone:
                self._restart("gone")
                rv = ""
            except ApiException as exc:
                if exc.status in (403, 404) and self._on_absent is not None:
                    self._on_absent(int(exc.status))
                    rv = ""
                    if self._listed is not None:
                        self._listed()
                    backoff.reset()
                    self._stop.wait(absent.next())
                    continue
                if exc.status == 410:
                    self._restart("gone")
                    rv = ""
                    continue
                self._retry(str(exc.reason), backoff)
            except Exception as exc:  # the watch must outlive API hiccups
                self._retry(str(exc), backoff)

    def _watch(self, rv: str, backoff: Backoff) -> str:
        """Apply the events of one watch from ``rv``; the version to resume from."""
        resp = self._open(rv)
        backoff.reset()  # the API server accepted the watch
        try:
            for etype, obj in watch_events(resp, self._stop, lambda exc: self._skipped(None, exc)):
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {quote(str(obj.get('message')))}")
                if etype != "BOOKMARK":
                    try:
                        self._apply(etype, obj)
                    except Exception as exc:  # one unreadable object costs only itself
                        self._skipped(obj, exc)
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                rv = str(new_rv) if new_rv else rv
        finally:
            resp.release_conn()
        return rv

    def _restart(self, cause: str) -> None:
        if self._restarted is not None:
            self._restarted(cause)

    def _retry(self, why: str, backoff: Backoff) -> None:
        self._restart("error")
        delay = backoff.next()
        self._log.warning(self.label, f"{self.label} watch failed ({quote(why)}); retrying in {delay:.1f}s")
        self._stop.wait(delay)
