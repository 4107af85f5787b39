"""Reading the product's YAML data files (catalog, model registry, profiles): one way to read a
file or a packaged resource and to turn validation errors into a line naming the entry and field."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def read_text(path: Path | str | None, package: str, resource: str, error: type[ValueError]
              ) -> tuple[str, str]:
    """(text, origin) of ``path``, or of the packaged resource when ``path`` is None."""
    if path is None:
        return files(package).joinpath(resource).read_text(encoding="utf-8"), f"{package}/{resource}"
    try:
        return Path(path).read_text(encoding="utf-8"), str(path)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc}") from exc


def problems(exc: ValidationError) -> str:
    return "; ".join(f"field {'.'.join(str(p) for p in err['loc']) or '?'!r}: {err['msg']}"
                     for err in exc.errors())


def entries(raw: list[Any], model: type[M], error: type[ValueError], origin: str, label_key: str
            ) -> list[M]:
    """Each item validated as ``model``; the first bad one fails the file, naming it."""
    out = []
    for i, item in enumerate(raw):
        label = f"#{i + 1}"
        if isinstance(item, dict) and isinstance(item.get(label_key), str) and item[label_key].strip():
            label += f" ({item[label_key].strip()})"
        if not isinstance(item, dict):
            raise error(f"{origin}: entry {label}: expected a mapping of fields")
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            raise error(f"{origin}: entry {label}: {problems(exc)}") from None
        except ValueError as exc:  # a field parser's own message
            raise error(f"{origin}: entry {label}: {exc}") from None
    return out
