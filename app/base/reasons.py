"""Why a node was rejected, as a code and a sentence; and the bounds every user-facing message keeps.

The code is the closed vocabulary of the ``rule`` label of ``llm_placement_node_rejections_total``
(docs/metrics.md) and the ``rule`` field of explain output; the message is what kube-scheduler quotes
in its ``0/N nodes are available`` event. Carrying both in one object means the metric, explain and
the event are read from the same verdict and cannot drift apart.

Messages are bounded: a filter answer repeats the reason once per node (the extender protocol has no
"one reason for all nodes" other than ``Error``, which turns the cycle into a scheduler error;
docs/extender-protocol.md), so a user value quoted whole would be multiplied by the cluster size.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MESSAGE_PREFIX = "llm-placement: "
# A rejection message is repeated for every node of a filter answer (5,000 x 320 B is 1.6 MB); the
# event kube-scheduler writes from it is truncated at 1 KB by the events API anyway.
MESSAGE_CHARS = 320
ELLIPSIS = "..."
# The events API truncates a message at 1 KB; ours stop there, escaped, rather than mid-character.
EVENT_MESSAGE_CHARS = 1024
# Why a persisted gang plan was not restored (docs/gangs.md, "Restored plans"; the ``reason`` label of
# llm_placement_rejected_gang_plans_total): the first four at the restore listing, unknown_node once
# the cache has listed the nodes. Here, below both, so the metric set need not import app.gang.
PLAN_REJECT_REASONS = ("unreadable", "gang_mismatch", "unsigned", "bad_signature", "future", "expired",
                       "unknown_node")


class ReasonCode(StrEnum):
    """The rule that rejected a node (a bounded metric label)."""

    NO_GPUS = "no_gpus"  # the pod requests GPUs, the node has none
    CPU_STAGE_ON_GPU = "cpu_stage_on_gpu"  # data-prep/deployment pods stay off GPU nodes
    GPUS_BUSY = "gpus_busy"  # not enough free GPUs (used, or reserved for a gang)
    GPU_CAPACITY = "gpu_capacity"  # the pod needs more GPUs (or MIG slices) than the node has at all
    UNKNOWN_GPU = "unknown_gpu"  # a sized LLM workload on a GPU product missing from the catalog
    SEPARATION = "separation"  # interactive serving kept off nodes running training
    PRECISION = "precision"  # the GPU lacks the precision asked for (fp8)
    LATENCY_SLO = "latency_slo"  # predicted ms/token above max-ms-per-token
    GPU_MEMORY = "gpu_memory"  # weights + KV cache do not fit in GPU memory
    DEVICE_SELECTOR = "device_selector"  # a DRA claim's selector or MIG profile excludes the node's GPUs
    HOST_MEMORY = "host_memory"  # the node's memory cannot hold the weights
    NOT_CACHED = "not_cached"  # the node is not in the extender's cache yet
    GANG = "gang"  # gang scheduling: waiting for members, being planned, reserved elsewhere
    TOPOLOGY = "topology"  # a gang's topology-required-placement domain has no room
    GRAVITY = "gravity"  # colocation with a depends-on producer
    OTHER = "other"  # anything else (never expected; counted so it shows up)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A node's verdict when it may not take the pod: which rule, and the sentence users read."""

    code: ReasonCode
    message: str
    unresolvable: bool = True  # True: evicting other pods would not make the node fit

    def __post_init__(self) -> None:
        # The last line of defence: whatever a message quotes, kube-scheduler's event gets one line.
        if len(self.message) > MESSAGE_CHARS or not self.message.isprintable():
            object.__setattr__(self, "message", one_line(self.message, MESSAGE_CHARS))


def reject(code: ReasonCode, text: str, unresolvable: bool = True) -> Rejection:
    """A Rejection whose message carries the product prefix kube-scheduler's event shows."""
    return Rejection(code, MESSAGE_PREFIX + text, unresolvable)


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, marked with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(ELLIPSIS))] + ELLIPSIS


# A user-chosen name quoted in a message (a gang, a producer; a namespace/name pair fits): short
# enough that a message naming a few of them stays under MESSAGE_CHARS.
SHOWN_CHARS = 128


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def one_line(text: str, limit: int) -> str:
    """A message as it may leave the process: every unprintable character (newline, NUL, escape
    sequences, bidi overrides, zero-width marks) escaped, then clipped to ``limit``.

    Events and filter reasons are read in terminals and dashboards: a raw newline forges a second
    line ("Successfully assigned ..."), ESC sequences rewrite the screen, U+202E reverses the text.
    """
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
    return clip(text, limit)


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A user-chosen value quoted in a message: printable (repr-style escapes, backslash doubled so
    an escape cannot be faked), at most ``limit`` characters, and its length said when cut."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, int | float) \
        else type(value).__name__
    if text.isprintable() and "\\" not in text and len(text) <= limit:
        return text  # the usual case: a plain DNS-style name
    out: list[str] = []
    used = 0
    for ch in text:
        piece = "\\\\" if ch == "\\" else ch if ch.isprintable() else _escape(ch)
        if used + len(piece) > limit:
            return "".join(out) + f"...({len(text)} chars)"
        out.append(piece)
        used += len(piece)
    return "".join(out)


class AnnotationProblem(str):
    """One reason a pod's annotations cannot be understood: the sentence (the string itself, so
    events, explain and the simulator read it as text) and the annotation key it concerns, the
    ``key`` label of ``llm_placement_invalid_annotations_total`` (docs/metrics.md)."""

    key: str

    def __new__(cls, key: str, message: str) -> AnnotationProblem:
        self = super().__new__(cls, message)
        self.key = key
        return self

    def __reduce__(self) -> tuple[type[AnnotationProblem], tuple[str, str]]:
        return AnnotationProblem, (self.key, str.__str__(self))


def problem_key(problem: str) -> str:
    """The key a problem concerns ("other" for one raised as plain text)."""
    return problem.key if isinstance(problem, AnnotationProblem) else "other"
