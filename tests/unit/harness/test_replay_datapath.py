"""Read time of a replayed pod's inputs over its network path (kubeharness/datapath.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.config.policy import ZONE_LABEL as PRODUCT_ZONE_LABEL
from app.config.policy import NodeLabelKeys
from kubeharness.datapath import (
    CROSS_ZONE,
    DATA,
    LEAF_LABEL,
    NVLINK_LABEL,
    SAME_LEAF,
    SAME_NODE,
    SAME_NVLINK,
    SAME_SPINE,
    SAME_ZONE,
    SPINE_LABEL,
    TIERS,
    ZONE_LABEL,
    DataPath,
    DataPathError,
    TierRead,
)

HOST = "kubernetes.io/hostname"


def node(name: str, *, clique: str = "", leaf: str = "", spine: str = "", zone: str = "") -> dict[str, str]:
    labels = {HOST: name}
    for key, value in ((NVLINK_LABEL, clique), (LEAF_LABEL, leaf), (SPINE_LABEL, spine), (ZONE_LABEL, zone)):
        if value:
            labels[key] = value
    return labels


# One consumer, and one producer node at each distance from it.
CONSUMER = node("c", clique="nvl-1", leaf="leaf-1", spine="spine-1", zone="zone-a")
AT: dict[str, dict[str, str]] = {
    SAME_NODE: dict(CONSUMER),
    SAME_NVLINK: node("p-nvl", clique="nvl-1", leaf="leaf-9", spine="spine-9", zone="zone-a"),
    SAME_LEAF: node("p-leaf", clique="nvl-2", leaf="leaf-1", spine="spine-1", zone="zone-a"),
    SAME_SPINE: node("p-spine", clique="nvl-3", leaf="leaf-2", spine="spine-1", zone="zone-a"),
    SAME_ZONE: node("p-zone", clique="nvl-4", leaf="leaf-3", spine="spine-2", zone="zone-a"),
    CROSS_ZONE: node("p-far", clique="nvl-5", leaf="leaf-4", spine="spine-3", zone="zone-b"),
}


def shipped_rows() -> list[dict[str, Any]]:
    return list(yaml.safe_load(DATA.read_text())["tiers"])


@pytest.fixture(scope="module")
def path() -> DataPath:
    return DataPath.load()


@pytest.mark.parametrize("expected", TIERS)
def test_each_tier_is_picked_from_its_labels(path: DataPath, expected: str) -> None:
    assert path.tier(CONSUMER, AT[expected]) == expected


def test_labels_count_only_when_both_nodes_carry_the_same_non_empty_value(path: DataPath) -> None:
    bare_a, bare_b = node("a"), node("b")
    # Neither node says anything but its name: distinct nodes in one unlabelled zone.
    assert path.tier(bare_a, bare_b) == SAME_ZONE
    # A clique, leaf or spine on one side only is no match; zone on one side only is another zone.
    assert path.tier(node("a", clique="x", leaf="l", spine="s"), bare_b) == SAME_ZONE
    assert path.tier(node("a", zone="zone-a"), bare_b) == CROSS_ZONE
    # Empty values never match each other.
    assert path.tier({HOST: "a", NVLINK_LABEL: ""}, {HOST: "b", NVLINK_LABEL: ""}) == SAME_ZONE
    assert path.tier({HOST: ""}, {HOST: ""}) == SAME_ZONE
    # Inner tiers win even when outer labels disagree.
    assert path.tier(node("a", leaf="l", zone="z1"), node("b", leaf="l", zone="z2")) == SAME_LEAF


def test_the_label_keys_are_ones_the_product_reads() -> None:
    keys = NodeLabelKeys()
    assert NVLINK_LABEL in keys.nvlink_domain
    assert LEAF_LABEL in keys.fabric_tiers[0]
    assert SPINE_LABEL in keys.fabric_tiers[1]
    assert ZONE_LABEL == PRODUCT_ZONE_LABEL


def test_read_time_never_shrinks_with_distance_and_grows_wherever_the_link_is_slower(path: DataPath) -> None:
    gb = 100.0
    times = [path.read_seconds(gb, CONSUMER, [AT[t]]) for t in TIERS]
    assert all(t > 0 for t in times)
    for inner, outer, t_in, t_out in zip(TIERS, TIERS[1:], times, times[1:], strict=False):
        if outer == SAME_SPINE:
            # Derived from the leaf's port rate (the file says so): same cost, never less.
            assert path.rows[SAME_SPINE].derived and path.gb_per_s[SAME_SPINE] == path.gb_per_s[SAME_LEAF]
            assert t_out == pytest.approx(t_in)
        else:
            assert t_out > t_in, (inner, outer)
    # Every remote tier pays more than the local read, and cross-zone is the dearest by far.
    assert times[-1] > 5 * times[0]


def test_the_charge_is_the_local_read_plus_staging_over_the_link(path: DataPath) -> None:
    local = path.gb_per_s[SAME_NODE]
    assert path.read_seconds(69.0, CONSUMER, [AT[SAME_NODE]]) == pytest.approx(69.0 / local)
    for t in TIERS[1:]:
        expected = 69.0 / local + 69.0 / path.gb_per_s[t]
        assert path.read_seconds(69.0, CONSUMER, [AT[t]]) == pytest.approx(expected), t


def test_shipped_figures_are_the_sourced_ones(path: DataPath) -> None:
    # 6,900 MB/s drive; 1.8 TB/s bidirectional NVLink / 2; 400 Gb/s / 8; 25 Gbps / 8; 5 Gbps / 8.
    assert path.gb_per_s == {SAME_NODE: 6.9, SAME_NVLINK: 900.0, SAME_LEAF: 50.0, SAME_SPINE: 50.0,
                             SAME_ZONE: 3.125, CROSS_ZONE: 0.625}


def test_zero_gb_costs_nothing_wherever_the_producer_is(path: DataPath) -> None:
    for t in TIERS:
        assert path.read_seconds(0.0, CONSUMER, [AT[t]]) == 0.0
    assert path.read_seconds(0, CONSUMER, []) == 0.0
    assert path.by_tier(0.0, CONSUMER, [AT[CROSS_ZONE]]) == {}


def test_a_gang_producer_is_read_share_by_share_through_one_link(path: DataPath) -> None:
    gb = 120.0
    sites = [AT[SAME_NODE], AT[SAME_LEAF], AT[CROSS_ZONE]]
    share = gb / 3
    expected = sum(share * path.seconds_per_gb(t) for t in (SAME_NODE, SAME_LEAF, CROSS_ZONE))
    assert path.read_seconds(gb, CONSUMER, sites) == pytest.approx(expected)
    # Equal shares at equal distance read as fast as the whole at that distance (one link, in turn).
    near = [AT[SAME_LEAF], node("p-leaf-2", leaf="leaf-1", zone="zone-a")]
    assert path.read_seconds(gb, CONSUMER, near) == pytest.approx(path.read_seconds(gb, CONSUMER, [AT[SAME_LEAF]]))
    # Moving one member's share closer makes the read faster.
    assert path.read_seconds(gb, CONSUMER, [AT[SAME_LEAF], AT[CROSS_ZONE]]) > \
        path.read_seconds(gb, CONSUMER, [AT[SAME_LEAF], AT[SAME_LEAF]])


def test_by_tier_reports_gb_moved_and_seconds_per_tier(path: DataPath) -> None:
    sites = [AT[SAME_NODE], AT[CROSS_ZONE], AT[CROSS_ZONE], AT[SAME_NVLINK]]
    out = path.by_tier(100.0, CONSUMER, sites)
    assert list(out) == [SAME_NODE, SAME_NVLINK, CROSS_ZONE]  # innermost first, uncrossed tiers absent
    assert isinstance(out[SAME_NODE], TierRead)
    assert out[SAME_NODE].gb == pytest.approx(25.0)
    assert out[SAME_NODE].seconds == pytest.approx(25.0 * path.seconds_per_gb(SAME_NODE))
    assert out[CROSS_ZONE].gb == pytest.approx(50.0)
    assert sum(r.gb for r in out.values()) == pytest.approx(100.0)
    assert sum(r.seconds for r in out.values()) == pytest.approx(path.read_seconds(100.0, CONSUMER, sites))


def test_a_read_with_no_site_or_a_bad_size_is_refused(path: DataPath) -> None:
    with pytest.raises(ValueError, match="no producer site"):
        path.read_seconds(10.0, CONSUMER, [])
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite number of GB"):
            path.read_seconds(bad, CONSUMER, [AT[SAME_NODE]])


def test_the_shipped_file_has_a_source_and_a_bandwidth_for_every_tier() -> None:
    rows = shipped_rows()
    assert [r["tier"] for r in rows] == list(TIERS)
    for r in rows:
        assert isinstance(r["gb_per_s"], int | float) and r["gb_per_s"] > 0, r["tier"]
        assert str(r["source"]).startswith("https://"), r["tier"]
        assert str(r["says"]).strip() and str(r["how"]).strip(), r["tier"]
        assert isinstance(r["derived"], bool), r["tier"]
        if r["derived"]:
            assert str(r.get("derived_reason", "")).strip(), r["tier"]
    # Only the spine shares another tier's figure, and it says why.
    assert [r["tier"] for r in rows if r["derived"]] == [SAME_SPINE]


def _without(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["tier"] != name]


def _with(rows: list[dict[str, Any]], name: str, **change: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(rows)
    for r in out:
        if r["tier"] == name:
            r.update(change)
            for key, value in change.items():
                if value is None:
                    del r[key]
    return out


@pytest.mark.parametrize(("rows", "message"), [
    (_without(shipped_rows(), SAME_ZONE), "missing tier.*same-zone"),
    (_with(shipped_rows(), SAME_LEAF, gb_per_s=0), "same-leaf: gb_per_s must be finite and above 0"),
    (_with(shipped_rows(), SAME_LEAF, gb_per_s=-50.0), "same-leaf: gb_per_s must be finite and above 0"),
    (_with(shipped_rows(), SAME_LEAF, gb_per_s=float("inf")), "same-leaf: gb_per_s must be finite"),
    (_with(shipped_rows(), SAME_NODE, gb_per_s=None), "same-node: gb_per_s must be a number"),
    (_with(shipped_rows(), SAME_NODE, gb_per_s="fast"), "same-node: gb_per_s must be a number"),
    (_with(shipped_rows(), CROSS_ZONE, source=None), "cross-zone: source is missing"),
    (_with(shipped_rows(), CROSS_ZONE, source="AWS docs"), "cross-zone: source must be an https:// URL"),
    (_with(shipped_rows(), SAME_NVLINK, says=" "), "same-nvlink-domain: says is missing"),
    (_with(shipped_rows(), SAME_SPINE, derived_reason=None), "same-spine: derived is true but derived_reason"),
    (_with(shipped_rows(), SAME_ZONE, derived="no"), "same-zone: derived must be true or false"),
    ([*shipped_rows(), shipped_rows()[0]], "same-node appears twice"),
    (_with(shipped_rows(), SAME_ZONE, tier="same-region"), "unknown tier 'same-region'"),
    ([*shipped_rows(), "oops"], "row 6 is not a mapping"),
])
def test_a_bad_table_is_refused_with_a_clear_error(rows: list[Any], message: str) -> None:
    with pytest.raises(DataPathError, match=message):
        DataPath(rows)


def test_a_file_without_a_tiers_list_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "data_path.yaml"
    bad.write_text("rows: []\n")
    with pytest.raises(DataPathError, match="no 'tiers' list"):
        DataPath.load(bad)
    bad.write_text("tiers: same-node\n")
    with pytest.raises(DataPathError, match="must be a list"):
        DataPath.load(bad)
