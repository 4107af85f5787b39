"""The workflow file: tasks with a stage, size, GPUs, duration (or work to estimate it from), the data
they write and the tasks they wait for. docs/planner.md describes the format.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from app.base.units import parse_param_count
from app.plan.files import WORKFLOW_MAX_BYTES, WORKFLOW_MAX_ITEMS, read_workflow_file

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PLAIN_NUMBER = re.compile(r"^\s*\d+(\.\d+)?([eE][+]?\d+)?\s*$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")
MAX_TASKS = WORKFLOW_MAX_ITEMS  # measured: BENCHMARKS.md section 8 (2,000 tasks on 1,000 nodes)
MAX_FILE_BYTES = WORKFLOW_MAX_BYTES  # a 2,000-task workflow is a few hundred KB
MAX_TOKENS = 1e15  # a thousand times the largest published pretraining runs' token counts


class WorkflowError(ValueError):
    """The workflow file is not usable; the message names the task and the field."""


def parse_duration(value: str | float | int) -> float:
    """``90``, ``"90s"``, ``"40m"``, ``"2.5h"``, ``"1d"`` -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(value)
        if not m:
            raise ValueError(f"{value!r} is not a duration like 90s, 40m or 2.5h")
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not 0 < seconds < 365 * 86400:
        raise ValueError(f"duration {value!r} must be positive and under a year")
    return seconds


def _count(value: str | float | int) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a token count")
    if isinstance(value, int | float) or _PLAIN_NUMBER.match(value):
        n = float(value)
    else:
        try:
            n = parse_param_count(str(value))
        except ValueError:
            raise ValueError(f"{str(value)[:40]!r} is not a token count like 2e12, 500B or 3T") from None
    if not 0 < n <= MAX_TOKENS:
        raise ValueError(f"{value!r} tokens: must be positive and at most {MAX_TOKENS:.0e}")
    return n


# A duration ("90m", "2h", seconds) and a token count ("2T", 1e12) as a workflow file writes them.
Duration = Annotated[float, BeforeValidator(lambda v: v if v is None else parse_duration(v))]
TokenCount = Annotated[float, BeforeValidator(lambda v: v if v is None else _count(v))]
NodeType = Annotated[str, BeforeValidator(str)]  # a YAML key such as 4090 reads as a number


class Task(BaseModel):
    """One step of the workflow: becomes one pod."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    stage: str
    model_params: str | None = None
    precision: str | None = None
    gpus: int = Field(0, ge=0, le=64)
    cpu: str = "4"
    memory: str = "16Gi"
    # The same on every node it may run on...
    duration: Duration | None = None
    # ...or the work, from which each node's duration is estimated (app.plan.estimate): training
    # tokens for pretraining/alignment, generated tokens for serving-class tasks (eval, serve).
    tokens: TokenCount | None = None
    output_gb: float = Field(0.0, ge=0, le=1e6)
    # Measured durations per node type (a GPU's catalog name or alias, or "cpu" for nodes without
    # GPUs): they win over ``duration`` and ``tokens`` on nodes of that type (docs/planner.md).
    durations: dict[NodeType, Duration] = Field(default_factory=dict, max_length=64)
    # GB read from each producer, where it is not the producer's whole output_gb.
    reads: dict[str, float] = Field(default_factory=dict, max_length=256)
    after: tuple[str, ...] = ()
    count: int = Field(1, ge=1, le=64)  # a sweep: name-0..name-(count-1), same inputs
    annotations: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r} is not a DNS-1123 label (lower case, digits, '-')")
        return v

    @field_validator("reads")
    @classmethod
    def _reads(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, gb in v.items() if not 0 <= gb <= 1e6]
        if bad:
            raise ValueError(f"reads of {bad[:3]} must be between 0 and 1e6 GB")
        return v

    @field_validator("model_params")
    @classmethod
    def _params(cls, v: str | None) -> str | None:
        if v is not None:
            parse_param_count(v)
        return v

    @field_validator("after", mode="before")
    @classmethod
    def _after(cls, v: Any) -> Any:
        return (v,) if isinstance(v, str) else v

    @field_validator("annotations", mode="before")
    @classmethod
    def _ann(cls, v: Any) -> Any:
        return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else v


class Workflow(BaseModel):
    """A named DAG of tasks (``count`` already expanded by ``expanded``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("workflow", min_length=1, max_length=253)
    namespace: str = Field("default", min_length=1, max_length=63)
    tasks: tuple[Task, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _graph(self) -> Workflow:
        names = [t.name for t in self.tasks]
        dup = sorted(n for n, k in Counter(names).items() if k > 1)
        if dup:
            raise ValueError(f"task names repeat: {dup[:10]}")
        known = set(names)
        for t in self.tasks:
            missing = [a for a in t.after if a not in known]
            if missing:
                raise ValueError(f"task {t.name}: after names unknown task(s) {missing}")
            strays = [r for r in t.reads if r not in t.after]
            if strays:
                raise ValueError(f"task {t.name}: reads names task(s) it does not wait for {strays[:5]}")
        total = sum(t.count for t in self.tasks)
        if total > MAX_TASKS:
            raise ValueError(f"{total} tasks after expanding counts; at most {MAX_TASKS}")
        expanded = self.expanded()
        # A sweep's members are name-0, name-1, ...: a task of its own may not take one of those names.
        clash = sorted(n for n, k in Counter(t.name for t in expanded).items() if k > 1)
        if clash:
            raise ValueError(f"task names repeat once sweeps (count) are expanded: {clash[:10]}")
        _check_acyclic(expanded)
        return self

    def expanded(self) -> list[Task]:
        """Sweeps (``count`` > 1) as separate tasks; ``after`` a sweep means after all of it."""
        members: dict[str, list[str]] = {
            t.name: [f"{t.name}-{i}" for i in range(t.count)] if t.count > 1 else [t.name]
            for t in self.tasks
        }
        out: list[Task] = []
        for t in self.tasks:
            after = tuple(m for a in t.after for m in members[a])
            # Reading from a sweep means reading that much from each of its members.
            reads = {m: gb for a, gb in t.reads.items() for m in members[a]}
            for name in members[t.name]:
                out.append(t.model_copy(update={"name": name, "after": after, "count": 1, "reads": reads}))
        return out


def _check_acyclic(tasks: list[Task]) -> None:
    state: dict[str, int] = {}
    deps = {t.name: t.after for t in tasks}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError("tasks wait for each other in a cycle: " + " -> ".join([*path, n]))
        state[n] = 1
        for d in deps[n]:
            visit(d, [*path, n])
        state[n] = 2

    for t in tasks:
        visit(t.name, [])


def load_workflow(path: str | Path | None = None, data: Any = None) -> Workflow:
    """The workflow in ``path`` (or its already read ``data``), or the bundled pipeline
    (app/plan/data/pipeline.yaml)."""
    where = str(path) if path else "bundled pipeline.yaml"
    if data is not None:
        pass
    elif path:
        data = read_workflow_file(path, WorkflowError)
    else:
        data = yaml.safe_load((files("app.plan") / "data" / "pipeline.yaml").read_text())
    if not isinstance(data, dict):
        raise WorkflowError(f"{where}: expected a mapping with 'tasks'")
    raw = data.get("tasks")
    # Limits first: nothing below may cost more than the limits allow.
    if isinstance(raw, list) and len(raw) > MAX_TASKS:
        raise WorkflowError(f"{where}: {len(raw)} tasks; at most {MAX_TASKS}")
    try:
        return Workflow.model_validate(data)
    except ValidationError as exc:
        raise WorkflowError(f"{where}: " + "; ".join(_problems(exc, raw))) from exc


def _problems(exc: ValidationError, raw: Any) -> list[str]:
    """One entry per real problem, the task named; pydantic's echo of a failed tuple as a whole
    ("tasks: at least 1 item") is left out when a task of it already explains why."""
    parts = []
    errors = exc.errors()
    per_task = any(len(e["loc"]) >= 2 and e["loc"][0] == "tasks" for e in errors)
    for err in errors:
        loc = list(err["loc"])
        if per_task and loc == ["tasks"]:
            continue
        if len(loc) >= 2 and loc[0] == "tasks" and isinstance(loc[1], int):
            entry = raw[loc[1]] if isinstance(raw, list) and loc[1] < len(raw) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            loc[1] = f"{str(name)[:64] if name else loc[1]}"
        where = ".".join(str(x) for x in loc) or "<root>"
        if err["type"] == "extra_forbidden":
            known = list(Task.model_fields) if len(loc) == 3 else list(Workflow.model_fields)
            near = difflib.get_close_matches(str(loc[-1]), known, n=1)
            parts.append(f"{where}: not a field" + (f" (did you mean {near[0]!r}?)" if near else ""))
            continue
        parts.append(f"{where}: {err['msg']}")
    return parts
