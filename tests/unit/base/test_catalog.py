"""The built-in GPU catalog: real cluster label values, conservative lookup, strict validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from app.base.catalog import CatalogError, GpuCatalog, GpuSpec, default_catalog, normalize

CATALOG = GpuCatalog.load()

REQUIRED = {
    "H200-SXM-141GB",
    "H100-SXM-80GB",
    "H100-PCIe-80GB",
    "H100-NVL-94GB",
    "A100-SXM4-80GB",
    "A100-SXM4-40GB",
    "A100-PCIe-40GB",
    "L40S",
    "L40",
    "L4",
    "A10G",
    "A10",
    "T4",
    "V100-SXM2-16GB",
    "V100-SXM2-32GB",
    "P100-PCIe-16GB",
    "MI300X",
    "B200",
    "GB200",
}

# (label value as clusters write it, expected entry, memory_gb, bandwidth TB/s)
REAL_LABELS = [
    # GPU Feature Discovery: nvidia.com/gpu.product
    ("NVIDIA-H100-80GB-HBM3", "H100-SXM-80GB", 80, 3.35),
    ("NVIDIA-H100-PCIe", "H100-PCIe-80GB", 80, 2.0),
    ("NVIDIA-H100-NVL", "H100-NVL-94GB", 94, 3.9),
    ("NVIDIA-A100-SXM4-80GB", "A100-SXM4-80GB", 80, 2.039),
    ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB", 40, 1.555),
    ("NVIDIA-A100-PCIE-40GB", "A100-PCIe-40GB", 40, 1.555),
    ("NVIDIA-A100-80GB-PCIe", "A100-PCIe-80GB", 80, 1.935),
    ("Tesla-T4", "T4", 16, 0.32),
    ("NVIDIA-L4", "L4", 24, 0.3),
    ("NVIDIA-A10G", "A10G", 24, 0.6),
    ("NVIDIA-A10", "A10", 24, 0.6),
    ("NVIDIA-L40S", "L40S", 48, 0.864),
    ("NVIDIA-L40", "L40", 48, 0.864),
    ("NVIDIA-H200", "H200-SXM-141GB", 141, 4.8),
    ("NVIDIA-H200-141GB-HBM3e", "H200-SXM-141GB", 141, 4.8),
    ("Tesla-V100-SXM2-16GB", "V100-SXM2-16GB", 16, 0.9),
    ("Tesla-V100-SXM2-32GB", "V100-SXM2-32GB", 32, 0.9),
    ("Tesla-V100-PCIE-16GB", "V100-PCIe-16GB", 16, 0.9),
    ("Tesla-P100-PCIE-16GB", "P100-PCIe-16GB", 16, 0.732),
    ("NVIDIA-B200", "B200", 180, 8.0),
    ("NVIDIA-GB200", "GB200", 186, 8.0),
    # GKE: cloud.google.com/gke-accelerator
    ("nvidia-h100-80gb", "H100-SXM-80GB", 80, 3.35),
    ("nvidia-h100-mega-80gb", "H100-SXM-80GB", 80, 3.35),
    ("nvidia-a100-80gb", "A100-SXM4-80GB", 80, 2.039),
    ("nvidia-tesla-a100", "A100-SXM4-40GB", 40, 1.555),
    ("nvidia-l4", "L4", 24, 0.3),
    ("nvidia-tesla-t4", "T4", 16, 0.32),
    ("nvidia-tesla-v100", "V100-SXM2-16GB", 16, 0.9),
    ("nvidia-tesla-p100", "P100-PCIe-16GB", 16, 0.732),
    ("nvidia-h200-141gb", "H200-SXM-141GB", 141, 4.8),
    ("nvidia-b200", "B200", 180, 8.0),
    # Alibaba GPU trace model names
    ("V100M16", "V100-SXM2-16GB", 16, 0.9),
    ("V100M32", "V100-SXM2-32GB", 32, 0.9),
    ("T4", "T4", 16, 0.32),
    ("P100", "P100-PCIe-16GB", 16, 0.732),
    ("A10", "A10", 24, 0.6),
    # AMD
    ("AMD-Instinct-MI300X-OAM", "MI300X", 192, 5.3),
]

NOT_IN_CATALOG = [
    # MIG slices carry a fraction of the parent's memory: never the parent entry
    "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
    "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
    "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
    "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
    "A100-SXM4-40GB-MIG-2g.10gb",
    "MIG-1g.5gb",
    "1g.10gb",
    # unknown or ambiguous products: no guessing
    "NVIDIA-H100",
    "A100",
    "V100",
    "NVIDIA-H200-NVL",
    "NVIDIA-H800",
    "NVIDIA-GH200-480GB",
    "Tesla-V100S-PCIE-32GB",
    "Tesla-P100-PCIE-12GB",
    "nvidia-tesla-k80",
    "nvidia-tesla-p4",
    "NVIDIA-A100-SXM4",
    "NVIDIA-H100-80GB-HBM3-EXTRA",
    "G2",
    "G3",
    "MISC",
    "",
    "   ",
    "-SHARED",
    "SHARED",
]


def _entry(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "Test-GPU",
        "vendor": "nvidia",
        "memory_gb": 24,
        "hbm_bandwidth_tbs": 0.3,
        "bf16_tflops": 121,
        "int8_tops": 242,
        "interconnect": "pcie4",
        "nvlink": False,
        "hourly_cost_usd": 0.8,
        "source": ["https://example.com/datasheet"],
        "aliases": ["TEST-GPU-24GB"],
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def _write(tmp_path: Path, entries: list[dict[str, Any]]) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "gpus": entries}, sort_keys=False))
    return path


# ------------------------------------------------------------------ the packaged catalog


def test_packaged_catalog_has_every_required_gpu() -> None:
    names = {spec.name for spec in CATALOG.entries}
    assert names >= REQUIRED
    assert len(CATALOG) == len(names)
    assert default_catalog() is default_catalog()
    assert {s.name for s in default_catalog()} == names


def test_every_entry_is_sourced_and_sane() -> None:
    for spec in CATALOG.entries:
        assert spec.source and all(u.startswith("https://") for u in spec.source), spec.name
        assert spec.aliases, spec.name
        # dense INT8 is about 2x dense BF16/FP16 at most; a sparse figure slipping in would show here
        assert spec.int8_tops is None or spec.int8_tops <= 2.1 * spec.bf16_tflops, spec.name
        assert 0.1 <= spec.hbm_bandwidth_tbs <= 10, spec.name
        assert 8 <= spec.memory_gb <= 320, spec.name
        # A figure no public source gives is left out, and the row says so.
        if spec.hourly_cost_usd is None or spec.int8_tops is None:
            assert any("left out" in n for n in spec.notes), spec.name
        assert spec.hourly_cost_usd is None or 0.1 <= spec.hourly_cost_usd <= 50, spec.name


@pytest.mark.parametrize(("label", "name", "bf16", "memory_gb"), [
    ("NVIDIA-B300", "B300", 2250, 288),
    ("NVIDIA-A800-SXM4-80GB", "A800-SXM4-80GB", 312, 80),
    ("NVIDIA-H20", "H20", 148, 96),
    ("AMD-Instinct-MI325X", "MI325X", 1307, 256),
    ("AMD-Instinct-MI355X-OAM", "MI355X", 2500, 288),
])
def test_added_products_resolve_with_their_sourced_figures(label: str, name: str, bf16: float,
                                                           memory_gb: float) -> None:
    spec = CATALOG.lookup(label)
    assert spec is not None and spec.name == name
    assert spec.bf16_tflops == bf16 and spec.memory_gb == memory_gb
    assert len(spec.source) >= 2 and spec.notes


def test_compute_capability_is_nvidias_format() -> None:
    with_cc = [s for s in CATALOG.entries if s.compute_capability]
    assert {s.vendor for s in with_cc} == {"nvidia"} and len(with_cc) >= 20
    assert CATALOG.by_name("H100-SXM-80GB").compute_capability == "9.0"  # type: ignore[union-attr]


@pytest.mark.parametrize(("label", "name", "memory_gb", "bandwidth"), REAL_LABELS)
def test_real_cluster_labels_resolve(label: str, name: str, memory_gb: float, bandwidth: float) -> None:
    spec = CATALOG.lookup(label)
    assert spec is not None, label
    assert spec.name == name
    assert spec.memory_gb == pytest.approx(memory_gb)
    assert spec.hbm_bandwidth_tbs == pytest.approx(bandwidth, rel=0.02)


@pytest.mark.parametrize(
    ("label", "bandwidth"),
    [
        ("NVIDIA-H100-80GB-HBM3", 3.35),
        ("NVIDIA-H200", 4.8),
        ("NVIDIA-A100-SXM4-80GB", 2.0),
        ("NVIDIA-L4", 0.3),
        ("Tesla-T4", 0.32),
    ],
)
def test_headline_bandwidths(label: str, bandwidth: float) -> None:
    spec = CATALOG.lookup(label)
    assert spec is not None
    assert spec.hbm_bandwidth_tbs == pytest.approx(bandwidth, abs=0.05)


def test_dense_throughput_and_topology_facts() -> None:
    h100 = CATALOG.by_name("H100-SXM-80GB")
    h100_pcie = CATALOG.by_name("h100-pcie-80gb")
    l40s = CATALOG.by_name("L40S")
    t4 = CATALOG.by_name("T4")
    mi300x = CATALOG.by_name("MI300X")
    assert h100 and h100_pcie and l40s and t4 and mi300x
    assert h100.bf16_tflops == pytest.approx(989, abs=1)  # dense, not the 1,979 sparse headline
    assert h100.int8_tops == pytest.approx(1979, abs=1)
    assert h100.nvlink and h100.interconnect.startswith("nvlink4")
    assert not h100_pcie.nvlink and not l40s.nvlink
    assert l40s.bf16_tflops == pytest.approx(362, abs=1)
    assert any("FP16" in n for n in t4.notes)  # no BF16 on Turing: says so
    assert mi300x.vendor == "amd" and mi300x.nvlink and mi300x.memory_gb == 192
    assert CATALOG.by_name("no-such-gpu") is None


@pytest.mark.parametrize("label", NOT_IN_CATALOG)
def test_mig_slices_and_unknown_products_are_none(label: str) -> None:
    assert CATALOG.lookup(label) is None


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("NVIDIA-A100-SXM4-80GB-SHARED", "A100-SXM4-80GB"),
        ("Tesla-T4-SHARED", "T4"),
        ("nvidia-l4-shared", "L4"),
        ("NVIDIA-H100-80GB-HBM3_SHARED", "H100-SXM-80GB"),
        ("NVIDIA_A100_SXM4_40GB", "A100-SXM4-40GB"),
        ("nvidia a100 sxm4 80gb", "A100-SXM4-80GB"),
        ("  NVIDIA-L40S  ", "L40S"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),  # nvidia-smi spelling
    ],
)
def test_shared_suffix_case_and_separators_still_resolve(label: str, name: str) -> None:
    spec = CATALOG.lookup(label)
    assert spec is not None and spec.name == name


def test_lookup_never_widens_to_a_bigger_gpu() -> None:
    # a 12 GB P100 must not become the 16 GB card, a V100S not the V100, an H200 NVL not the SXM
    for label in ("Tesla-P100-PCIE-12GB", "Tesla-V100S-PCIE-32GB", "NVIDIA-H200-NVL"):
        assert CATALOG.lookup(label) is None


def test_lookup_tolerates_non_strings() -> None:
    assert CATALOG.lookup(None) is None  # type: ignore[arg-type]
    assert CATALOG.lookup(42) is None  # type: ignore[arg-type]


def test_spec_is_frozen() -> None:
    spec = CATALOG.by_name("L4")
    assert spec is not None
    with pytest.raises(ValueError):
        spec.memory_gb = 999  # type: ignore[misc]
    assert hash(spec) == hash(CATALOG.lookup("nvidia-l4"))


# ------------------------------------------------------------------ broken catalog files


def test_valid_custom_file_loads(tmp_path: Path) -> None:
    cat = GpuCatalog.load(_write(tmp_path, [_entry(), _entry(name="Other", aliases=["OTHER-GPU"])]))
    assert [s.name for s in cat.entries] == ["Test-GPU", "Other"]
    assert cat.lookup("test_gpu_24gb") is not None


def test_duplicate_alias_names_both_entries(tmp_path: Path) -> None:
    path = _write(tmp_path, [_entry(), _entry(name="Second-GPU", aliases=["TEST-GPU-24GB"])])
    with pytest.raises(CatalogError, match=r"entry 'Second-GPU'.*aliases.*'Test-GPU'"):
        GpuCatalog.load(path)


def test_alias_colliding_after_normalisation_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, [_entry(), _entry(name="Second-GPU", aliases=["test_gpu 24gb"])])
    with pytest.raises(CatalogError, match="Second-GPU"):
        GpuCatalog.load(path)


def test_alias_equal_to_another_entry_name_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, [_entry(), _entry(name="Second-GPU", aliases=["test-gpu"])])
    with pytest.raises(CatalogError, match=r"Second-GPU.*Test-GPU"):
        GpuCatalog.load(path)


def test_duplicate_name_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, [_entry(), _entry(name="test-gpu", aliases=["OTHER"])])
    with pytest.raises(CatalogError, match=r"entry 'test-gpu'.*'name'.*duplicate"):
        GpuCatalog.load(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hbm_bandwidth_tbs", -3.35),
        ("hbm_bandwidth_tbs", 0),
        ("memory_gb", -80),
        ("bf16_tflops", 0),
        ("int8_tops", -1),
        ("hourly_cost_usd", 0),
        ("memory_gb", float("inf")),
        ("hbm_bandwidth_tbs", "fast"),
    ],
)
def test_non_positive_numbers_are_rejected(tmp_path: Path, field: str, value: object) -> None:
    path = _write(tmp_path, [_entry(), _entry(name="Bad-GPU", aliases=["BAD"], **{field: value})])
    with pytest.raises(CatalogError, match=rf"entry 'Bad-GPU'.*field '{field}'"):
        GpuCatalog.load(path)


@pytest.mark.parametrize(
    "field", ["memory_gb", "hbm_bandwidth_tbs", "bf16_tflops", "nvlink", "source", "aliases"]
)
def test_missing_field_names_entry_and_field(tmp_path: Path, field: str) -> None:
    entry = _entry(name="Incomplete-GPU", aliases=["INCOMPLETE"])
    del entry[field]
    with pytest.raises(CatalogError, match=rf"entry 'Incomplete-GPU'.*field '{field}'.*required"):
        GpuCatalog.load(_write(tmp_path, [_entry(), entry]))


def test_entry_without_name_is_identified_by_position(tmp_path: Path) -> None:
    entry = _entry()
    del entry["name"]
    with pytest.raises(CatalogError, match=r"entry #1.*field 'name'"):
        GpuCatalog.load(_write(tmp_path, [entry]))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"source": ["http://insecure.example/ds.pdf"]}, "source"),
        ({"source": []}, "source"),
        ({"aliases": []}, "aliases"),
        ({"aliases": ["FOO-MIG-1g.5gb"]}, "aliases"),
        ({"aliases": ["FOO-SHARED"]}, "aliases"),
        ({"aliases": ["--"]}, "aliases"),
        ({"nvlink": "yes"}, "nvlink"),
        ({"vendor": "acme"}, "vendor"),
        ({"color": "green"}, "color"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, overrides: dict[str, Any], field: str) -> None:
    path = _write(tmp_path, [_entry(name="Odd-GPU", **overrides)])
    with pytest.raises(CatalogError, match=rf"entry 'Odd-GPU'.*field '{field}'"):
        GpuCatalog.load(path)


def test_repeated_key_in_one_entry_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    text = yaml.safe_dump({"gpus": [_entry()]}, sort_keys=False)
    path.write_text(text.replace("  memory_gb: 24\n", "  memory_gb: 24\n  memory_gb: 240\n"))
    with pytest.raises(CatalogError, match=r"memory_gb.*twice"):
        GpuCatalog.load(path)


@pytest.mark.parametrize("text", ["gpus: []\n", "gpus: {}\n", "just a string\n", "gpus: [1, 2]\n", "a: [\n"])
def test_malformed_files_raise_catalog_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=str(path)):
        GpuCatalog.load(path)


def test_missing_file_raises_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read"):
        GpuCatalog.load(tmp_path / "absent.yaml")


# ------------------------------------------------------------------ properties

ALIAS_PAIRS = sorted((alias, spec.name) for spec in CATALOG.entries for alias in (spec.name, *spec.aliases))
SEPARATORS = st.sampled_from(["-", "_", " ", "--", "_-", " - "])


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_lookup_never_raises_on_arbitrary_text(text: str) -> None:
    result = CATALOG.lookup(text)
    assert result is None or isinstance(result, GpuSpec)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ALIAS_PAIRS), st.data())
def test_case_and_separator_variants_resolve_to_the_same_entry(
    pair: tuple[str, str], data: st.DataObject
) -> None:
    alias, name = pair
    tokens = [t for t in normalize(alias).split("-") if t]
    mangled_tokens = [
        "".join(c.upper() if data.draw(st.booleans()) else c.lower() for c in tok) for tok in tokens
    ]
    out = mangled_tokens[0]
    for tok in mangled_tokens[1:]:
        out += data.draw(SEPARATORS) + tok
    if data.draw(st.booleans()):
        out += data.draw(SEPARATORS) + data.draw(st.sampled_from(["SHARED", "shared", "Shared"]))
    out = data.draw(st.sampled_from(["", " "])) + out + data.draw(st.sampled_from(["", " "]))
    spec = CATALOG.lookup(out)
    assert spec is not None, out
    assert spec.name == name
    # whatever resolves is exactly the entry its normalised form names, never a neighbour
    assert CATALOG.lookup(alias) == spec


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALIAS_PAIRS), st.sampled_from(["1g.5gb", "1g.10gb", "3g.40gb", "7g.80gb"]))
def test_any_mig_suffix_on_any_alias_is_unknown(pair: tuple[str, str], profile: str) -> None:
    assert CATALOG.lookup(f"{pair[0]}-MIG-{profile}") is None
