"""The planner's two input files, read with the limits docs/planner.md states, before anything costly.

Each file is read by ``app.base.datafile.load_user_yaml`` (size, aliases, encoding, depth). Before it,
a count check: YAML's C event parser walks the document without building it and stops at the first
list longer than the file may hold, or once the document has more values than any file within the
limits (a few MB of ``- {}`` is a million tasks; building them takes minutes and gigabytes, counting
them up to the limit a fraction of a second). Light imports only: the command calls this before it
loads the solver.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from app.base.datafile import load_user_yaml

# A workflow: at most 2,000 tasks (docs/planner.md); no list in it (tasks, after, ...) may be longer.
WORKFLOW_MAX_BYTES = 4 * 1024 * 1024
WORKFLOW_MAX_ITEMS = 2_000
WORKFLOW_MAX_VALUES = 300_000  # 150 per task at 2,000 tasks
# A cluster: at most 20,000 nodes in a Node List, or groups.
CLUSTER_MAX_BYTES = 64 * 1024 * 1024
CLUSTER_MAX_ITEMS = 20_000
CLUSTER_MAX_VALUES = 1_000_000


class FileLimitError(ValueError):
    """The file holds more than the planner reads; the message says what and the limit."""


def check_counts(path: str | Path, max_bytes: int, max_items: int, max_values: int, what: str) -> None:
    """Refuse ``path`` if a list in it has more than ``max_items`` entries or the document more than
    ``max_values`` values. Files this cannot read (not a regular file, not UTF-8, not YAML) are left
    to ``load_user_yaml``, which says why."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return
        with open(path, "rb") as fh:
            text = fh.read(max_bytes + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    items: list[int] = []  # entries so far of each open list (-1: an open mapping)
    values = 0
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.CollectionEndEvent):
                items.pop()
                continue
            if isinstance(event, yaml.NodeEvent):
                values += 1
                if values > max_values:
                    raise FileLimitError(f"{path}: more than {max_values:,} values; a {what} within the "
                                         "limits has fewer (docs/planner.md)")
                if items and items[-1] >= 0:
                    items[-1] += 1
                    if items[-1] > max_items:
                        line = event.start_mark.line + 1 if event.start_mark is not None else "?"
                        raise FileLimitError(f"{path}: a list of more than {max_items:,} entries (line "
                                             f"{line}); a {what} holds at most {max_items:,}")
                if isinstance(event, yaml.SequenceStartEvent):
                    items.append(0)
                elif isinstance(event, yaml.MappingStartEvent):
                    items.append(-1)
    except yaml.YAMLError:
        return


def read_workflow_file(path: str | Path, error: type[ValueError] = ValueError) -> Any:
    try:
        check_counts(path, WORKFLOW_MAX_BYTES, WORKFLOW_MAX_ITEMS, WORKFLOW_MAX_VALUES, "workflow")
    except FileLimitError as exc:
        raise error(str(exc)) from None
    return load_user_yaml(path, error, WORKFLOW_MAX_BYTES)


def read_cluster_file(path: str | Path, error: type[ValueError] = ValueError) -> Any:
    try:
        check_counts(path, CLUSTER_MAX_BYTES, CLUSTER_MAX_ITEMS, CLUSTER_MAX_VALUES, "cluster file")
    except FileLimitError as exc:
        raise error(str(exc)) from None
    return load_user_yaml(path, error, CLUSTER_MAX_BYTES)


def process_age() -> float:
    """Seconds since this process started (0 where /proc does not say): the time limit of
    ``llm-placement plan`` counts from the command's start, interpreter included."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def fail_line(message: str) -> None:
    """An error as one line on stderr, never wrapped (scripts read it, also with --json)."""
    import sys

    print(" ".join(message.split()), file=sys.stderr, flush=True)
