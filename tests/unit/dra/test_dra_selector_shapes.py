"""A DeviceClass or request selector is read only where its logical structure allows (docs/dra.md,
"What is read from selectors"): whatever the shape (``&&``, ``||``, ``!``, parentheses, atoms we know
and atoms we do not), the devices the extender takes the selector to accept include every device the
selector really accepts (widen, never narrow)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.base.catalog import GpuCatalog
from app.base.objects import node_object, pod_object
from app.base.workload import parse_workload
from app.cluster.cache import apply_node
from app.config.settings import Settings
from app.dra.cel_bool import And, Atom, Node, Not, Or, parse
from app.dra.devices import DraDevice, parse_device
from app.dra.selectors import (
    Selection,
    class_selection,
    device_satisfies,
    devices_of,
    product_matches,
    read_selectors,
)
from app.extender.wiring import build_core
from tests.unit.dra import dra_fixtures as fx

DRIVER = fx.DRIVER
L4 = "NVIDIA L4"


@dataclass(frozen=True)
class Dev:
    """A sample device and the facts the reference evaluation reads (not the extender's parser)."""

    name: str
    driver: str
    type: str
    product: str
    memory_mib: float
    profile: str | None
    architecture: str | None
    raw: dict[str, Any]


def _mib(q: str) -> float:
    return float(q.removesuffix("Mi"))


DEVICES = [
    Dev("h100", DRIVER, "gpu", fx.H100, _mib(fx.H100_MEMORY), None, "Hopper", fx.gpu(0)),
    Dev("l4", DRIVER, "gpu", L4, 23034, None, "Ada Lovelace",
        fx.gpu(1, L4, "23034Mi", architecture="Ada Lovelace")),
    Dev("mig1g", DRIVER, "mig", fx.H100, 9856, "1g.10gb", None, fx.static_mig(0, "1g.10gb", 0)),
    Dev("mig3g", DRIVER, "mig", fx.H100, _mib(fx.MIG_PROFILES["3g.40gb"][1]), "3g.40gb", None,
        fx.static_mig(1, "3g.40gb", 0)),
    Dev("vfio", DRIVER, "vfio", fx.H100, 0, None, None, fx.vfio(2)),
    Dev("other", "other.example.com", "gpu", fx.H100, _mib(fx.H100_MEMORY), None, "Hopper", fx.gpu(3)),
]

A = 'device.attributes["gpu.nvidia.com"]'
CAP = 'device.capacity["gpu.nvidia.com"]'
# (CEL text, the reference's truth on a device); None: an atom the extender does not read, whose
# truth the test draws per device.
KNOWN: list[tuple[str, Any]] = [
    ('device.driver == "gpu.nvidia.com"', lambda d: d.driver == DRIVER),
    ('device.driver == "other.example.com"', lambda d: d.driver == "other.example.com"),
    (f'{A}.type == "mig"', lambda d: d.type == "mig"),
    (f'{A}.type == "gpu"', lambda d: d.type == "gpu"),
    (f'{A}.type == "vfio"', lambda d: d.type == "vfio"),
    (f'{A}.type != "mig"', lambda d: d.type != "mig"),
    (f'{A}.type in ["gpu", "mig"]', lambda d: d.type in ("gpu", "mig")),
    (f'{A}.productName == "{fx.H100}"', lambda d: d.product == fx.H100),
    (f'{A}.productName in ["{L4}", "NVIDIA T4"]', lambda d: d.product in (L4, "NVIDIA T4")),
    (f'{A}.productName.startsWith("NVIDIA H")', lambda d: d.product.startswith("NVIDIA H")),
    (f'{CAP}.memory.compareTo(quantity("40Gi")) >= 0', lambda d: d.memory_mib >= 40 * 1024),
    (f'{A}.profile == "1g.10gb"', lambda d: d.profile == "1g.10gb"),
    (f'{A}.architecture == "Hopper"', lambda d: d.architecture == "Hopper"),
    (f'{A}.productName != "{L4}"', lambda d: d.product != L4),
]
UNKNOWN = [
    'device.attributes["other.example.com"].x == "y"',
    f'{A}.driverVersion.isGreaterThan(semver("570.0.0"))',
    "size(device.attributes) > 3",
    f'{A}.type == "mig" ? true : false',  # a ternary inside parentheses is an atom we do not read
]
N_ATOMS = len(KNOWN) + len(UNKNOWN)


def _render_atom(i: int, quote: str) -> str:
    text = KNOWN[i][0] if i < len(KNOWN) else f"({UNKNOWN[i - len(KNOWN)]})"
    return text.replace('"', quote)


# A formula: ("atom", i) | ("not", f) | ("and", f, g) | ("or", f, g) | ("paren", f)
formulas = st.recursive(
    st.tuples(st.just("atom"), st.integers(0, N_ATOMS - 1)),
    lambda sub: st.one_of(st.tuples(st.just("not"), sub), st.tuples(st.just("and"), sub, sub),
                          st.tuples(st.just("or"), sub, sub), st.tuples(st.just("paren"), sub)),
    max_leaves=8)


def render(f: tuple[Any, ...], quote: str) -> str:
    tag = f[0]
    if tag == "atom":
        return _render_atom(f[1], quote)
    if tag == "not":
        return f"!({render(f[1], quote)})"
    if tag == "paren":
        return f"({render(f[1], quote)})"
    # Children that are themselves "and"/"or" get parentheses: the formula's structure is explicit.
    parts = [render(c, quote) if c[0] in ("atom", "not", "paren") else f"({render(c, quote)})"
             for c in f[1:]]
    return (" && " if tag == "and" else " || ").join(parts)


def reference(f: tuple[Any, ...], d: Dev, unknown: dict[tuple[str, int], bool]) -> bool:
    """The selector's value on ``d`` straight from the formula (CEL's semantics for these atoms)."""
    tag = f[0]
    if tag == "atom":
        i = f[1]
        return KNOWN[i][1](d) if i < len(KNOWN) else unknown[(d.name, i)]
    if tag == "not":
        return not reference(f[1], d, unknown)
    if tag == "paren":
        return reference(f[1], d, unknown)
    vals = [reference(c, d, unknown) for c in f[1:]]
    return all(vals) if tag == "and" else any(vals)


def extender_accepts(sel: Selection, d: Dev) -> bool:
    """Could a device be handed out under what the extender read? A class the extender does not
    take for the driver's restricts nothing (it counts no GPUs for it)."""
    if sel.driver is None:
        return True
    if sel.driver != d.driver or (sel.kind is not None and sel.kind != d.type):
        return False
    if not product_matches(sel.products, d.product):
        return False
    if sel.min_memory_mib and d.memory_mib + 1e-9 < sel.min_memory_mib:
        return False
    if sel.profiles is not None and d.profile not in sel.profiles:
        return False
    dev = parse_device(d.raw)
    assert isinstance(dev, DraDevice)
    return not sel.device or device_satisfies(dev, sel.device, DRIVER)


def device_class(expr: str) -> dict[str, Any]:
    return {"metadata": {"name": "c"}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=formulas, quote=st.sampled_from(['"', "'"]),
       bits=st.lists(st.booleans(), min_size=len(DEVICES) * len(UNKNOWN),
                     max_size=len(DEVICES) * len(UNKNOWN)))
def test_what_the_extender_reads_never_refuses_a_device_the_selector_accepts(
        f: tuple[Any, ...], quote: str, bits: list[bool]) -> None:
    unknown = {(d.name, len(KNOWN) + j): bits[k * len(UNKNOWN) + j]
               for k, d in enumerate(DEVICES) for j in range(len(UNKNOWN))}
    expr = render(f, quote)
    assert parse(expr) is not None, expr
    sel = class_selection(device_class(expr))
    # The same reading for a request's selector (the driver known from its class).
    req = read_selectors([{"cel": {"expression": expr}}])
    for d in DEVICES:
        if reference(f, d, unknown):
            assert extender_accepts(sel, d), (expr, d.name, sel)
            if d.driver == DRIVER:
                assert extender_accepts(Selection(driver=DRIVER).merge(req), d), (expr, d.name, req)


NOT_MIG = "device.driver == 'gpu.nvidia.com' && !(device.attributes['gpu.nvidia.com'].type == 'mig')"
MIG_OR_GPU = ("device.driver == 'gpu.nvidia.com' && (device.attributes['gpu.nvidia.com'].type == 'mig' "
              "|| device.attributes['gpu.nvidia.com'].type == 'gpu')")


@pytest.mark.parametrize(("expr", "driver", "kind", "devices", "unread"), [
    (fx.GPU_CLASS["spec"]["selectors"][0]["cel"]["expression"], DRIVER, "gpu", "gpu", 0),
    (fx.MIG_CLASS["spec"]["selectors"][0]["cel"]["expression"], DRIVER, "mig", "mig", 0),
    (fx.VFIO_CLASS["spec"]["selectors"][0]["cel"]["expression"], DRIVER, "vfio", None, 0),
    (NOT_MIG, DRIVER, None, "gpu", 1),
    (MIG_OR_GPU, DRIVER, None, "gpu", 1),
    # A negation of a negation, and a type pinned in every branch of a disjunction.
    (f"device.driver == 'gpu.nvidia.com' && !({A}.type != 'mig')", DRIVER, "mig", "mig", 1),
    (f"device.driver == 'gpu.nvidia.com' && (({A}.type == 'mig' && {A}.profile == '1g.10gb') || "
     f"({A}.type == 'mig' && {A}.profile == '3g.40gb'))", DRIVER, "mig", "mig", 1),
    (f"device.driver == 'gpu.nvidia.com' && {A}.type in ['gpu', 'mig']", DRIVER, None, "gpu", 1),
    (f"device.driver == 'gpu.nvidia.com' && {A}.type == 'gpu' && !({A}.productName == 'NVIDIA L4')",
     DRIVER, "gpu", "gpu", 1),
    # The driver only in a disjunction, or negated: not the driver's class.
    ("device.driver == 'gpu.nvidia.com' || device.driver == 'other.example.com'", None, None, "gpu", 1),
    (f"!(device.driver == 'gpu.nvidia.com') && {A}.type == 'mig'", None, "mig", "mig", 1),
    ("(device.driver == 'gpu.nvidia.com') && (" + f"{A}.type == 'mig')", DRIVER, "mig", "mig", 0),
    # Not parsed at all: nothing read, not even the driver.
    (f"device.driver == 'gpu.nvidia.com' && {A}.type == 'mig' ? true : false", None, None, "gpu", 1),
    (f"device.driver == 'gpu.nvidia.com' && ({A}.type == 'mig'", None, None, "gpu", 1),
    (f"device.driver == 'gpu.nvidia.com' && {A}.type == '''mig'''", None, None, "gpu", 1),
])
def test_device_classes_read_only_where_the_whole_selector_is_understood(
        expr: str, driver: str | None, kind: str | None, devices: str | None, unread: int) -> None:
    sel = class_selection(device_class(expr))
    assert (sel.driver, sel.kind, devices_of(sel), len(sel.unread)) == (driver, kind, devices, unread), sel


def _cluster() -> Any:
    """Node ``h``: 8 free full H100s; node ``m``: MIG slices only."""
    svc = build_core(Settings(cluster_source="none", metrics_port=0), GpuCatalog.load())
    dra = svc.snapshot.dra
    dra.put_class(fx.GPU_CLASS)
    dra.put_class(fx.MIG_CLASS)
    for name, expr in (("not-mig", NOT_MIG), ("mig-or-gpu", MIG_OR_GPU)):
        dra.put_class({**device_class(expr), "metadata": {"name": name}})
    dra.put_slice(fx.slice_("h", [fx.gpu(i) for i in range(8)]))
    dra.put_slice(fx.slice_("m", [fx.static_mig(0, "1g.10gb", s) for s in range(7)]))
    for n in ("h", "m"):
        apply_node(svc.snapshot, svc.catalog, svc.settings, node_object(n, gpus=0))
    dra.reads_claims = True
    return svc


@pytest.mark.parametrize(("cls", "passed"), [
    ("not-mig", ["h"]),
    ("mig-or-gpu", ["h"]),
    ("mig.nvidia.com", ["m"]),  # a real MIG class still asks for MIG slices
])
def test_classes_with_a_negated_or_alternative_type_place_on_full_gpus(cls: str, passed: list[str]) -> None:
    svc = _cluster()
    svc.snapshot.dra.put_claim(fx.claim("c", fx.request(cls)))
    pod = pod_object("p", gpus=0, stage="serving", uid="u-p",
                     annotations={"llm-placement.io/latency-class": "batch"})
    pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "c"}]
    got = svc.placer.filter(pod, ["h", "m"])
    assert got.passed == passed, got.unresolvable
    notes = parse_workload(pod, claims=svc.snapshot.claim_reader()).claim_notes
    # The class's part that is not read is named for explain.
    assert any("type" in n for n in notes) == (cls != "mig.nvidia.com"), notes


@pytest.mark.parametrize("expr", [
    "(" * 5000 + "device.driver == 'gpu.nvidia.com'" + ")" * 5000,
    "!" * 5000 + "(device.driver == 'gpu.nvidia.com')",
    " && ".join(["device.driver == 'gpu.nvidia.com'"] * 3000),
    "device.driver == '\\",
    "\x00",
])
def test_hostile_selectors_cost_little_and_read_nothing(expr: str) -> None:
    t0 = time.perf_counter()
    sel = class_selection(device_class(expr))
    assert time.perf_counter() - t0 < 0.5
    assert sel.driver is None and sel.unread


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("()[]!&|=\"'.abcdriveype ?:,\\")), max_size=80))
def test_any_text_is_read_or_refused_without_an_error(expr: str) -> None:
    class_selection(device_class(expr))
    read_selectors([{"cel": {"expression": expr}}])


@pytest.mark.parametrize(("expr", "tree"), [
    ("a == 1 && (b == 2 || !(c == 3))",
     And((Atom("a == 1"), Or((Atom("b == 2"), Not(Atom("c == 3"))))))),
    ("(a).b == 'x'", Atom("(a).b == 'x'")),  # parentheses inside a comparison: one atom
    ("f(a && b) == c || d", Or((Atom("f(a && b) == c"), Atom("d")))),
    ("x == '&& || !' && y == r\"(\"", And((Atom("x == '&& || !'"), Atom('y == r"("')))),
    ("x == 'it\\'s' && y", And((Atom("x == 'it\\'s'"), Atom("y")))),
    ("((a == 1))", Atom("a == 1")),
    ("(a ? b : c) && d", And((Atom("(a ? b : c)"), Atom("d")))),
    ("a ? b : c", None),  # a ternary at the top is not read
    ("a && ", None),
    ("(a == 1", None),
    ("a == 1)", None),
    ("x == '''a'''", None),
    ("x == 'unterminated", None),
    ("x == `y`", None),  # a character CEL does not have
])
def test_the_logical_structure_is_parsed_strictly(expr: str, tree: Node | None) -> None:
    assert parse(expr) == tree
