"""The settings' generated files, from the model in app/config/settings.py (app/config/docs.py):

    python -m scripts.gen_config_docs           # (re)write them
    python -m scripts.gen_config_docs --check   # exit 1 and name the files that differ

Writes docs/configuration.md and the ``extender.settings`` part of helm/llm-placement/values.schema.json
(the rest of that file is the chart's own and is left as it is).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.config.docs import helm_settings_schema, markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "configuration.md"
CHART_SCHEMA = ROOT / "helm" / "llm-placement" / "values.schema.json"


def generated() -> dict[Path, str]:
    """Each generated file's path and the content it must have."""
    chart = json.loads(CHART_SCHEMA.read_text(encoding="utf-8"))
    chart["properties"]["extender"]["properties"]["settings"] = helm_settings_schema()
    return {DOCS: markdown(), CHART_SCHEMA: json.dumps(chart, indent=2) + "\n"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that differ")
    args = parser.parse_args()
    stale = [p for p, text in generated().items()
             if not p.exists() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            print(f"out of date: {p.relative_to(ROOT)} (run python -m scripts.gen_config_docs)")
        return 1 if stale else 0
    for p, text in generated().items():
        if p in stale:
            p.write_text(text, encoding="utf-8")
            print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
