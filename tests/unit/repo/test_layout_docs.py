"""README's "Layout" section matches the tree: it names every top-level folder and module of app/, and
every app/ path it names exists."""

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
        tops.add(first + "/" if sep or (APP / first).is_dir() else first)  # `app/core` is a folder too
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
    section = "app/core/ pure\napp/gang/kube.py watch\napp/wire.py types\napp/nothing.py gone\n"
    assert top_level(named_paths(section)) == {"core/", "gang/", "wire.py", "nothing.py"}
    assert "service.py" in tree_entries() - top_level(named_paths(section))
