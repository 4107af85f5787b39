"""README's "Layout" section matches the tree: it names every top-level folder and module of app/, and
every app/ path it names exists. The unit tests follow the same parts: one folder of tests/unit per
folder of app/ they test, besides the few that test no part of app/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
APP = REPO / "app"


def layout_section(readme: str) -> str:
    match = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    assert match, 'README has no "## Layout" section'
    return match.group(1)


def named_paths(section: str) -> set[str]:
    """Every ``app/...`` path the section writes, as written (folders end with a slash)."""
    return set(re.findall(r"\bapp/[\w./]*[\w/]", section))


def top_level(paths: set[str]) -> set[str]:
    """The top-level entry of app/ each path is in: ``app/gang/kube.py`` -> ``gang/``."""
    tops = set()
    for path in paths:
        first, sep, _ = path.removeprefix("app/").partition("/")
        tops.add(first + "/" if sep or (APP / first).is_dir() else first)  # `app/base` is a folder too
    return tops


def tree_entries() -> set[str]:
    entries = {p.name + "/" for p in APP.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    return entries | {p.name for p in APP.glob("*.py") if p.name != "__init__.py"}


def test_layout_names_every_top_level_part_of_app() -> None:
    named = top_level(named_paths(layout_section((REPO / "README.md").read_text())))
    missing, extra = tree_entries() - named, named - tree_entries()
    assert not missing, f'README "Layout" does not name: {sorted(missing)}'
    assert not extra, f'README "Layout" names what app/ does not hold: {sorted(extra)}'


def test_every_app_path_in_the_layout_exists() -> None:
    stale = [p for p in named_paths(layout_section((REPO / "README.md").read_text()))
             if not (REPO / p).exists() or (p.endswith("/") and not (REPO / p).is_dir())]
    assert not stale, f'README "Layout" names paths that do not exist: {sorted(stale)}'


def test_the_checks_see_a_missing_or_stale_name() -> None:
    section = "app/base/ pure\napp/gang/kube.py watch\napp/api/wire.py types\napp/nothing.py gone\n"
    assert top_level(named_paths(section)) == {"base/", "gang/", "api/", "nothing.py"}
    assert "extender/" in tree_entries() - top_level(named_paths(section))


UNIT = REPO / "tests" / "unit"
# Unit-test folders that test no part of app/: the control-plane harness and testkit, the benchmarks'
# own logic, and rules over the repository itself.
NOT_APP_PARTS = {"harness", "benchmarks", "repo"}


def test_unit_tests_sit_in_the_folder_of_their_part() -> None:
    loose = sorted(p.name for p in UNIT.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"tests/unit/ holds loose files, put each in its part's folder: {loose}"
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    parts = {entry.rstrip("/") for entry in tree_entries() if entry.endswith("/")}
    assert folders - parts - NOT_APP_PARTS == set(), "tests/unit folders that match no part of app/"
    missing_init = sorted(f for f in folders if not (UNIT / f / "__init__.py").exists())
    assert not missing_init, f"folders without __init__.py (same basenames would collide): {missing_init}"
