"""`llm-placement profiles import`: serving-benchmark results become measured-profile entries.

The result files are written here from the field names the benchmarks use (vLLM
benchmark_serving --save-result: one JSON object; SGLang bench_serving --output-file: JSON lines),
with made-up figures; docs/stage-policy.md, "Importing benchmark results".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from app.base.catalog import GpuCatalog
from app.cli import cli
from app.config.settings import Settings
from app.serving.profiles import ProfileBook


def _summary(*, tpot: float, ttft: float, cap: int | None, prompts: int = 100, prompt_len: int = 1000,
             **extra: Any) -> dict[str, Any]:
    """A benchmark summary: each statistic a distinct value so the test sees which one was used."""
    return {
        "max_concurrency": cap, "completed": prompts, "total_input_tokens": prompts * prompt_len,
        "total_output_tokens": prompts * 128, "duration": 60.0,
        "mean_tpot_ms": tpot * 1.1, "median_tpot_ms": tpot, "p99_tpot_ms": tpot * 1.7,
        "mean_ttft_ms": ttft * 1.2, "median_ttft_ms": ttft, "p99_ttft_ms": ttft * 3,
        **extra,
    }


def _vllm(tmp_path: Path, name: str = "vllm.json", **kw: Any) -> tuple[Path, dict[str, Any]]:
    data = _summary(**kw, date="20260502-093000", backend="vllm",
                    model_id="meta-llama/Llama-3.1-8B-Instruct", tokenizer_id="meta-llama/Llama-3.1-8B-Instruct",
                    num_prompts=kw.get("prompts", 100), request_rate="inf", burstiness=1.0)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path, data


def _import(*args: str) -> Any:
    return CliRunner().invoke(cli, ["profiles", "import", *args])


BASE = ["--model-params", "8B", "--gpu", "NVIDIA-L4", "--precision", "int8"]


def test_vllm_result_becomes_a_profile_the_extender_loads(tmp_path: Path) -> None:
    path, data = _vllm(tmp_path, tpot=38.5, ttft=240.0, cap=8, prompt_len=1536)
    res = _import(str(path), *BASE)
    assert res.exit_code == 0, res.output
    book = ProfileBook.from_data(yaml.safe_load(res.stdout))
    [p] = book.entries
    assert p.ms_per_token == data["median_tpot_ms"] and p.ttft_ms == data["median_ttft_ms"]
    assert p.prompt_tokens == data["total_input_tokens"] // data["completed"]
    assert p.max_concurrency == data["max_concurrency"]
    assert p.model == data["model_id"].rsplit("/", 1)[1]  # named after the file's model_id
    assert p.model_params == 8e9 and p.gpus == 1 and p.precision.value == "int8"
    l4 = GpuCatalog.load().lookup("NVIDIA-L4")
    assert l4 is not None and p.gpu == l4.name  # the catalog's name, whatever alias was given
    assert "vLLM" in p.source and data["date"] in p.source and "median" in p.source
    # The output is a profiles file the settings accept as it is.
    out = tmp_path / "profiles.yaml"
    out.write_text(res.stdout)
    assert Settings(cluster_source="none", metrics_port=0, profiles_file=str(out)).profiles_file


@pytest.mark.parametrize("stat", ["mean", "p99", "median"])
def test_statistic_picks_the_field(tmp_path: Path, stat: str) -> None:
    path, data = _vllm(tmp_path, tpot=30.0, ttft=200.0, cap=4)
    res = _import(str(path), *BASE, "--statistic", stat)
    assert res.exit_code == 0, res.output
    [p] = ProfileBook.from_data(yaml.safe_load(res.stdout)).entries
    assert p.ms_per_token == data[f"{stat}_tpot_ms"] and p.ttft_ms == data[f"{stat}_ttft_ms"]


def test_sglang_jsonl_sweep_keeps_the_highest_concurrency_or_the_one_asked(tmp_path: Path) -> None:
    runs = [_summary(tpot=20.0 + cap, ttft=150.0 + cap, cap=cap, backend="sglang", dataset_name="random")
            for cap in (16, 32, 4)]
    path = tmp_path / "sglang.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    # SGLang's summary does not name the model: --model is needed.
    res = _import(str(path), *BASE)
    assert res.exit_code == 2 and "--model" in res.output
    res = _import(str(path), *BASE, "--model", "llama-8b")
    assert res.exit_code == 0, res.output
    [p] = ProfileBook.from_data(yaml.safe_load(res.stdout)).entries
    top = max(runs, key=lambda r: r["max_concurrency"])
    assert (p.max_concurrency, p.ms_per_token) == (top["max_concurrency"], top["median_tpot_ms"])
    assert "SGLang" in p.source and p.model == "llama-8b"
    res = _import(str(path), *BASE, "--model", "llama-8b", "--concurrency", "4")
    [p] = ProfileBook.from_data(yaml.safe_load(res.stdout)).entries
    four = next(r for r in runs if r["max_concurrency"] == 4)
    assert (p.max_concurrency, p.ms_per_token) == (4, four["median_tpot_ms"])
    res = _import(str(path), *BASE, "--model", "llama-8b", "--concurrency", "8")
    assert res.exit_code == 2 and "no run at max_concurrency 8" in res.output


def test_several_files_are_one_sweep(tmp_path: Path) -> None:
    a, _ = _vllm(tmp_path, "a.json", tpot=25.0, ttft=100.0, cap=2)
    b, data_b = _vllm(tmp_path, "b.json", tpot=45.0, ttft=300.0, cap=16)
    res = _import(str(b), str(a), *BASE)  # the highest cap wins, not the last file
    assert res.exit_code == 0, res.output
    [p] = ProfileBook.from_data(yaml.safe_load(res.stdout)).entries
    assert p.max_concurrency == data_b["max_concurrency"] and p.ms_per_token == data_b["median_tpot_ms"]
    assert "b.json" in p.source


def test_out_replaces_the_same_model_gpu_and_precision_and_keeps_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "profiles.yaml"
    out.write_text(yaml.safe_dump({"profiles": [
        {"model": "other", "model_params": "70B", "gpu": "H100-SXM-80GB", "gpus": 4, "precision": "bf16",
         "ms_per_token": 12.0},
        {"model": "old", "model_params": "8B", "gpu": "L4", "precision": "int8", "ms_per_token": 99.0},
    ]}))
    path, data = _vllm(tmp_path, tpot=37.0, ttft=210.0, cap=8)
    res = _import(str(path), *BASE, "--out", str(out))
    assert res.exit_code == 0, res.output
    entries = ProfileBook.load(out).entries
    assert [e.model for e in entries] == ["other", data["model_id"].rsplit("/", 1)[1]]
    assert entries[1].ms_per_token == data["median_tpot_ms"]
    # A different precision is another entry.
    res = _import(str(path), *BASE[:-1], "fp8", "--out", str(out))
    assert res.exit_code == 0 and len(ProfileBook.load(out).entries) == 3


@pytest.mark.parametrize(
    ("content", "args", "complaint"),
    [
        ('{"median_tpot_ms": 30.0, "max_concurrency": 4', [], "not valid JSON"),
        ('{\n  "median_tpot_ms": 30.0,\n  "completed": \n}\n', [], "line 4"),
        ("[1, 2, 3]", [], "expected a JSON object"),
        ('{"completed": 10, "duration": 5.0}', [], "no median_tpot_ms or median_ttft_ms"),
        ('{"median_tpot_ms": -0.0, "median_ttft_ms": 120.0}', [], "no decode was measured"),
        ('{"median_tpot_ms": "fast"}', [], "not a number"),
        ('{"median_tpot_ms": 30.0, "max_concurrency": 0}', [], "max_concurrency"),
        ('{"median_tpot_ms": 30.0}\n{"median_tpot_ms": 31.0}\nnot json\n', [], "line 3"),
        ("", [], "empty file"),
        ('{"median_tpot_ms": 30.0}', ["--gpu", "H900"], "not in the GPU catalog"),
        ('{"median_tpot_ms": 30.0}', ["--precision", "int3"], "int3"),
        ('{"median_tpot_ms": 30.0}', ["--model-params", "8Q"], "8Q"),
        ('{"median_tpot_ms": 30.0}', ["--statistic", "p50"], "p50"),
    ],
    ids=["truncated", "broken-multiline", "not-object", "not-a-benchmark", "zero-tpot", "string",
         "bad-cap", "bad-jsonl-line", "empty", "unknown-gpu", "bad-precision", "bad-params", "bad-stat"],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, content: str, args: list[str], complaint: str) -> None:
    path = tmp_path / "result.json"
    path.write_text(content)
    opts = dict(zip(BASE[::2], BASE[1::2], strict=True))
    opts.update(dict(zip(args[::2], args[1::2], strict=True)))
    res = _import(str(path), "--model", "m", *[x for kv in opts.items() for x in kv])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and complaint in lines[0], res.output
    assert "Traceback" not in res.output


def test_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    res = _import(str(tmp_path / "nope.json"), *BASE, "--model", "m")
    assert res.exit_code == 2 and "cannot read" in res.output and len(res.output.strip().splitlines()) == 1
