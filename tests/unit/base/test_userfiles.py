"""Every file a user hands a command goes through one hardened reader (docs/stage-policy.md, "Limits
of user files"): devices, FIFOs, directories, size bombs, nesting bombs, NUL bytes, invalid UTF-8 and
physically absurd rows are refused with exit status 2 and one line naming the file (and the row and
field), within 2 s of CPU and 200 MB, measured in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.base import userfiles
from app.base.datafile import load_user_yaml
from app.calibration import fit
from app.calibration.corpus import MAX_FILE_BYTES as CORPUS_CAP
from app.calibration.corpus import CorpusError, load_file
from app.plan.workflow import MAX_FILE_BYTES as WORKFLOW_CAP
from app.serving.profiles import ProfileBook, ProfileError
from app.serving.profiles_import import MAX_RESULT_BYTES, BenchmarkImportError, read_runs

ROOT = Path(__file__).resolve().parents[3]
# Runs the command as a child and reports what it cost: getrusage(RUSAGE_CHILDREN) in a process whose
# only child is the command.
PROBE = """
import json, resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr,
                  "cpu": u.ru_utime + u.ru_stime, "rss_mb": u.ru_maxrss / 1024}))
"""

POINT = {"locator": "t1", "engine": "vllm", "model": "llama-3.1-8b", "precision": "bf16",
         "gpu": "H100-SXM-80GB", "gpus": 1, "concurrency": 1, "input_tokens": 1000,
         "output_tokens": 100, "tpot_ms": 7.5, "ttft_ms": 40.0}
SOURCE = {"id": "mine", "title": "Mine", "url": "https://example.org/mine"}
BENCH = {"model_id": "m", "max_concurrency": 4, "completed": 10, "total_input_tokens": 10_000,
         "total_output_tokens": 1280, "median_tpot_ms": 20.0, "median_ttft_ms": 150.0}


def corpus_text(**change: Any) -> str:
    return yaml.safe_dump({"source": SOURCE, "points": [POINT, {**POINT, **change}]})


# Hostile contents, each written as it would arrive. ``None``: the path is given, not written.
def _sparse(size: int) -> Callable[[Path], None]:
    def write(p: Path) -> None:
        with open(p, "wb") as f:  # a hole: a file just over the cap costs no disk
            f.truncate(size)
    return write


def _bytes(data: bytes) -> Callable[[Path], None]:
    return lambda p: p.write_bytes(data)


HOSTILE: dict[str, tuple[Callable[[Path], None] | str, str]] = {
    "nested-lists": (_bytes(b"[" * 10_240), "nested too deeply"),
    "nested-mappings": (_bytes(b"{a: " * 50_000), "nested too deeply"),
    "nul": (_bytes(b'{"source": 1,\n "x": "a\x00b"}\n'), "a NUL byte at line 2, column 9: not a text file"),
    "utf8": (_bytes(b'{"source": 1,\n "x": "caf\xe9"}\n'), "not UTF-8 text (invalid continuation byte at line 2"),
    "dev-zero": ("/dev/zero", "a character device, not a regular file"),
    "fifo": (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
    "directory": (lambda p: p.mkdir(), "a directory, not a regular file"),
}


def _materialise(tmp_path: Path, case: str, cap: int | None = None) -> Path:
    if case == "oversize":
        assert cap is not None
        path = tmp_path / "big.json"
        _sparse(cap + 1)(path)
        return path
    how, _ = HOSTILE[case]
    if isinstance(how, str):
        return Path(how)
    path = tmp_path / f"{case}.json"
    how(path)
    return path


def run_cli(*args: str, timeout: float = 60) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", PROBE, sys.executable, "-m", "app.cli", *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=True)
    got: dict[str, Any] = json.loads(out.stdout)
    return got


def assert_refused(got: dict[str, Any], path: Path | str, words: str) -> None:
    lines = got["stderr"].strip().splitlines()
    assert got["rc"] == 2, got
    assert len(lines) == 1 and lines[0].startswith(f"{path}:") and words in lines[0], got["stderr"]
    assert "Traceback" not in got["stdout"] + got["stderr"]
    assert got["cpu"] < 2.0 and got["rss_mb"] < 200, got


BENCH_ARGS = ["--model", "llama-3.1-8b", "--gpu", "L4", "--precision", "bf16"]
PROFILE_ARGS = ["--model-params", "8B", "--gpu", "L4", "--precision", "bf16", "--model", "m"]
COMMANDS: dict[str, tuple[Callable[[str], list[str]], int]] = {
    "calibrate": (lambda p: ["calibrate", p, "--no-cross-validate"], CORPUS_CAP),
    "calibrate-bench": (lambda p: ["calibrate", "--bench", p, *BENCH_ARGS], MAX_RESULT_BYTES),
    "profiles-import": (lambda p: ["profiles", "import", p, *PROFILE_ARGS], MAX_RESULT_BYTES),
    "plan": (lambda p: ["plan", p, "--time-limit", "1"], WORKFLOW_CAP),
}


@pytest.mark.parametrize("case", [*HOSTILE, "oversize"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_hostile_files_exit_2_with_one_line_naming_the_file(tmp_path: Path, command: str, case: str) -> None:
    if command == "calibrate" and case == "directory":
        pytest.skip("calibrate reads a directory as a folder of measurement files")
    args, cap = COMMANDS[command]
    path = _materialise(tmp_path, case, cap)
    words = HOSTILE[case][1] if case in HOSTILE else f"more than {cap} bytes"
    assert_refused(run_cli(*args(str(path))), path, words)


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"tpot_ms": 1e300}, "tpot_ms", "less than or equal to 60000"),
    ({"ttft_ms": float("inf")}, "ttft_ms", "finite"),
    ({"gpus": 1_048_576}, "gpus", "less than or equal to 1024"),
    ({"concurrency": 10**7}, "concurrency", "less than or equal to 65536"),
    ({"input_tokens": 10**9}, "input_tokens", "less than or equal to 10000000"),
    ({"model": "toy", "model_params": "7B", "active_params": "70B"}, "active_params", "more than the model's"),
])
def test_absurd_corpus_rows_are_refused_with_row_and_field(change: dict[str, Any], field: str,
                                                           words: str) -> None:
    with pytest.raises(CorpusError) as err:
        load_file("mine.yaml", text=corpus_text(**change))
    msg = str(err.value)
    assert msg.startswith("mine.yaml: point #2: ") and f"'{field}'" in msg and words in msg, msg
    assert "\n" not in msg


def test_an_absurd_corpus_row_exits_2_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(corpus_text(tpot_ms=1e300))
    assert_refused(run_cli("calibrate", str(path), "--no-cross-validate"), path, "point #2: field 'tpot_ms'")


@pytest.mark.parametrize(("change", "words"), [
    ({"median_tpot_ms": 1e300}, "field 'median_tpot_ms' is 1e+300 ms, more than 60,000"),
    ({"median_ttft_ms": 1e12}, "field 'median_ttft_ms'"),
    ({"max_concurrency": 1_048_576}, "field 'max_concurrency' is 1048576"),
    ({"total_input_tokens": 10**12}, "prompt tokens per request 100,000,000,000"),
])
def test_absurd_benchmark_rows_are_refused_with_row_and_field(tmp_path: Path, change: dict[str, Any],
                                                              words: str) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(BENCH) + "\n" + json.dumps({**BENCH, **change}) + "\n")
    with pytest.raises(BenchmarkImportError) as err:
        read_runs(path)
    assert str(err.value).startswith(f"{path}:2: ") and words in str(err.value), err.value


@pytest.mark.parametrize(("change", "field"), [
    ({"ms_per_token": 1e300}, "ms_per_token"),
    ({"gpus": 1_048_576}, "gpus"),
    ({"max_concurrency": 10**7}, "max_concurrency"),
    ({"prompt_tokens": 10**9}, "prompt_tokens"),
    ({"active_params": "70B"}, "?"),
])
def test_absurd_profile_rows_are_refused_with_row_and_field(tmp_path: Path, change: dict[str, Any],
                                                            field: str) -> None:
    row = {"model": "m", "model_params": "7B", "gpu": "L4", "precision": "bf16", "ms_per_token": 20}
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump({"profiles": [row, {**row, **change}]}))
    with pytest.raises(ProfileError) as err:
        ProfileBook.load(path)
    assert str(err.value).startswith(f"{path}: entry #2 (m): field '{field}'"), err.value


def test_profiles_import_refuses_an_absurd_existing_profiles_file(tmp_path: Path) -> None:
    bench = tmp_path / "run.json"
    bench.write_text(json.dumps(BENCH))
    out = tmp_path / "profiles.yaml"
    out.write_text(yaml.safe_dump({"profiles": [
        {"model": "m", "model_params": "7B", "gpu": "L4", "precision": "bf16", "ms_per_token": 1e300}]}))
    got = run_cli("profiles", "import", str(bench), *PROFILE_ARGS, "--out", str(out))
    assert_refused(got, out, "entry #1 (m): field 'ms_per_token'")


@pytest.mark.parametrize(("text", "words"), [
    ("a: &x [1, 2]\nb: *x\n", "aliases (*x) are not accepted; write the value out at line 2, column 4"),
    ("a: [1, 2\n", "not valid YAML: while parsing a flow sequence did not find expected ',' or ']' at "
                   "line 2, column 1"),
    ("- " * 10_000 + "x\n", "nested too deeply (more than 64 levels) at line 1"),
    ("a: 1\n---\nb: 2\n", "not valid YAML: expected a single document in the stream but found another document"),
])
def test_yaml_problems_are_one_line_with_the_place(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_user_yaml(path, ValueError, 1 << 20)
    assert str(err.value).startswith(f"{path}: ") and words in str(err.value), err.value
    assert "\n" not in str(err.value)


def test_a_file_at_the_cap_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("a: " + "x" * 97 + "\n")  # 101 bytes
    assert load_user_yaml(path, ValueError, 101) == {"a": "x" * 97}
    with pytest.raises(ValueError, match="more than 100 bytes"):
        load_user_yaml(path, ValueError, 100)


def test_a_value_count_cap_is_checked_while_reading(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("tasks: [" + ", ".join(["{}"] * 1000) + "]\n")
    assert len(userfiles.load_user_yaml(path, ValueError, 1 << 20, max_nodes=1003)["tasks"]) == 1000
    with pytest.raises(ValueError, match="more than 500 values"):
        userfiles.load_user_yaml(path, ValueError, 1 << 20, max_nodes=500)


@pytest.mark.parametrize(("text", "ok"), [
    ('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', True),
    ('{"a": "\\"[[[["}', True),
    ("[" * 65 + "]" * 65, False),
    ("[" * 64 + "]" * 64, True),
    ('"\\"\\"\\"' * 100_000, True),  # an unterminated string: linear, the parser refuses it
])
def test_json_depth_is_checked_before_parsing_and_strings_are_text(text: str, ok: bool) -> None:
    if ok:
        userfiles.check_json_depth(text, "f.json", ValueError)
    else:
        with pytest.raises(ValueError, match="nested too deeply"):
            userfiles.check_json_depth(text, "f.json", ValueError)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _one_point_sources(n: int) -> list[Any]:
    rows = []
    for i in range(n):
        src = {**SOURCE, "id": f"s{i:03d}"}
        rows += load_file(f"s{i}.yaml", text=yaml.safe_dump({"source": src, "points": [
            {**POINT, "concurrency": 1 + i % 8}]}))
    return rows


def test_cross_validation_groups_sources_and_keeps_to_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _one_point_sources(300)
    fits: list[int] = []

    def counting_fit(rest: Any, start: Any = None, provenance: Any = None) -> Any:
        fits.append(len(rest))
        return fit.ServingCalibration()

    monkeypatch.setattr(fit, "fit", counting_fit)
    whole = fit.cross_validation(rows, budget_s=None)
    # 300 sources in 16 folds: 16 fits, every source held out once.
    assert (whole.folds, whole.done, whole.sources, whole.cut) == (16, 16, 300, ())
    assert len(fits) == 16 and len(whole.ratios) == 2 * 300 and whole.grouped
    assert "300 sources in 16 folds" in whole.describe()
    fits.clear()
    cut = fit.cross_validation(rows, budget_s=3.5, clock=_Clock())
    assert cut.done == len(fits) < 16 and len(cut.cut) == 300 - sum(
        len(f) for f in fit.folds_of(rows)[:cut.done])
    assert f"after {cut.done} of 16 folds" in cut.describe() and cut.cut[0] in cut.describe()
    # Few sources: each left out alone, as before.
    few = fit.cross_validation(rows[:10], budget_s=None)
    assert (few.folds, few.grouped) == (10, False)
