"""Reading a file a user hands a command (calibration measurements, benchmark results, profiles,
planner workflows and clusters, settings): one hardened reader, so every command refuses the same
hostile inputs the same way (docs/stage-policy.md, "Limits of user files"). Pure.

* only a regular file is read (a device, a FIFO, a directory is named and refused, never opened for
  long: FIFOs are opened non-blocking);
* the size is capped while reading, not by ``stat`` (a device or ``/proc`` file says 0);
* a NUL byte and invalid UTF-8 are named with the file, line and column;
* YAML: no aliases (a few hundred bytes of them expand to gigabytes), nesting capped
  before the composer recurses, optionally a cap on the number of values; libyaml scans and parses
  when PyYAML has it (a flow collection nested past its own limit is refused there at once);
* JSON: nesting checked by a linear scan before any parser sees the text;
* every problem is one line naming the file, raised as the caller's ``ValueError`` subclass.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any, cast

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from app.base.units import MAX_PARAMS

MAX_DEPTH = 64  # nesting of lists and mappings; every user file of the product needs fewer than 10
_CHUNK = 1 << 16

try:  # libyaml's scanner and parser, our own composer on top
    from yaml._yaml import CParser as _Parser  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml.parser import Parser as _PyParser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, _PyParser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            _PyParser.__init__(self)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(str(text).split())


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _position(data: bytes | str, offset: int) -> str:
    nl = b"\n" if isinstance(data, bytes) else "\n"
    line = data.count(nl, 0, offset) + 1  # type: ignore[arg-type]
    column = offset - (data.rfind(nl, 0, offset) + 1) + 1  # type: ignore[arg-type]
    return f"line {line}, column {column}"


def read_user_bytes(path: Path | str, error: type[ValueError], max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, counted while reading."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise error(f"{path}: cannot read: {one_line(exc.strerror or str(exc))}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: {_kind(mode)}, not a regular file; only files are read")
        parts: list[bytes] = []
        got = 0
        while got <= max_bytes:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise error(f"{path}: more than {max_bytes} bytes; at most {max_bytes} are read from such a file")
        return b"".join(parts)
    except OSError as exc:
        raise error(f"{path}: cannot read: {one_line(exc.strerror or str(exc))}") from None
    finally:
        os.close(fd)


def decode_user_text(data: bytes, origin: str, error: type[ValueError]) -> str:
    """UTF-8 text (a leading byte-order mark dropped); a NUL byte or a bad sequence is named."""
    if (nul := data.find(b"\x00")) >= 0:
        raise error(f"{origin}: a NUL byte at {_position(data, nul)}: not a text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{origin}: not UTF-8 text ({exc.reason} at {_position(data, exc.start)}, "
                    f"byte {exc.start})") from None
    return text.removeprefix("\ufeff")


def read_user_text(path: Path | str, error: type[ValueError], max_bytes: int) -> str:
    return decode_user_text(read_user_bytes(path, error, max_bytes), str(path), error)


class _Refusal(yaml.YAMLError):
    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message, self.mark = message, mark


class _StrictComposer(Composer):
    """Our composer over libyaml's events: no aliases, nesting and the number of values capped."""

    max_depth = MAX_DEPTH
    max_nodes: int | None = None
    _depth = 0
    _nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = cast(Any, self).peek_event()  # the parser's, below in the MRO
        if isinstance(event, yaml.AliasEvent):
            # An anchor alone expands nothing; its aliases do.
            raise _Refusal(f"aliases (*{event.anchor}) are not accepted; write the value out",
                           event.start_mark)
        self._nodes += 1
        if self.max_nodes is not None and self._nodes > self.max_nodes:
            raise _Refusal(f"more than {self.max_nodes:,} values", event.start_mark)
        if isinstance(event, yaml.CollectionStartEvent):
            if self._depth >= self.max_depth:
                raise _Refusal(f"nested too deeply (more than {self.max_depth} levels)", event.start_mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)


class StrictLoader(_StrictComposer, _Parser, SafeConstructor, Resolver):
    """SafeLoader's constructor and resolver over libyaml's parser, with ``_StrictComposer``."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)


def _mark(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def parse_user_yaml(text: str, origin: str, error: type[ValueError], *, max_depth: int = MAX_DEPTH,
                    max_nodes: int | None = None) -> Any:
    """The one YAML document in ``text``, or ``error`` naming ``origin`` and the place."""
    loader = StrictLoader(text)
    loader.max_depth, loader.max_nodes = max_depth, max_nodes
    try:
        return loader.get_single_data()
    except _Refusal as exc:
        raise error(f"{origin}: {exc.message}{_mark(exc.mark)}") from None
    except yaml.MarkedYAMLError as exc:
        what = one_line(" ".join(p for p in (exc.context, exc.problem) if p) or "syntax error")
        if "maximum nesting depth" in what:  # libyaml's own cap on flow collections
            raise error(f"{origin}: nested too deeply{_mark(exc.problem_mark)}") from None
        raise error(f"{origin}: not valid YAML: {what}{_mark(exc.problem_mark)}") from None
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML: {one_line(str(exc))}") from None
    except RecursionError:  # not expected past the depth cap; never a traceback
        raise error(f"{origin}: nested too deeply to read") from None
    finally:
        loader.dispose()


def load_user_yaml(path: Path | str, error: type[ValueError], max_bytes: int, *,
                   max_depth: int = MAX_DEPTH, max_nodes: int | None = None) -> Any:
    """A YAML (or JSON) file a user hands a command, read by the rules above."""
    return parse_user_yaml(read_user_text(path, error, max_bytes), str(path), error,
                           max_depth=max_depth, max_nodes=max_nodes)


_JSON_SKIP = re.compile(r'"(?:[^"\\]|\\.)*"|[^\[\]{}"]+')


def check_json_depth(text: str, origin: str, error: type[ValueError], max_depth: int = MAX_DEPTH
                     ) -> None:
    """Refuse JSON (or JSON lines) nested deeper than ``max_depth``, before parsing: one linear
    scan, strings skipped (a bracket in a string is text)."""
    depth, pos, n = 0, 0, len(text)
    while pos < n:
        m = _JSON_SKIP.match(text, pos)
        if m is not None:
            pos = m.end()
            continue
        c = text[pos]
        if c == '"':
            return  # an unterminated string: the rest is in it, and the parser refuses it
        if c in "[{":
            depth += 1
            if depth > max_depth:
                raise error(f"{origin}: nested too deeply (more than {max_depth} levels) at "
                            f"{_position(text, pos)}")
        elif c in "]}":
            depth = max(0, depth - 1)
        pos += 1


def parse_user_json(text: str, origin: str, error: type[ValueError], max_depth: int = MAX_DEPTH) -> Any:
    check_json_depth(text, origin, error, max_depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{origin}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
                    ) from None
    except RecursionError:
        raise error(f"{origin}: nested too deeply to read") from None


# --- physical bounds of measurement rows (calibration corpus, benchmark results, profiles) -------
# A row outside them is a typo or a forgery, never a measurement: fitted, it would move every
# estimate (or make a calibration ``serve`` refuses). docs/stage-policy.md, "Limits of user files".
MAX_ROW_MS_PER_TOKEN = 60_000.0  # a minute per output token
MAX_ROW_TTFT_MS = 3_600_000.0  # an hour to the first token
MAX_ROW_THROUGHPUT = 1e9  # tokens per second
MAX_ROW_GPUS = 1024  # GPUs (and tensor/pipeline/expert-parallel ranks) of one serving replica
MAX_ROW_CLIENTS = 65_536  # concurrent requests
MAX_ROW_REQUESTS = 10_000_000
MAX_ROW_TOKENS = 10_000_000  # prompt or output tokens of one request
MAX_ROW_PARAMS = MAX_PARAMS  # parameters: the bound a pod's annotation has
