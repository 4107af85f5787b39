"""Reading the product's YAML data files (catalog, model registry, profiles): one way to read a
file or a packaged resource and to turn validation errors into a line naming the entry and field."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError

from app.base import userfiles
from app.base.units import parse_param_count
from app.base.userfiles import MAX_DEPTH

M = TypeVar("M", bound=BaseModel)
MAX_DATA_FILE_BYTES = 16 << 20  # a catalog, model registry or calibration file of one's own


def _param_count(value: object) -> object:
    return parse_param_count(value) if isinstance(value, str) else value


# A parameter count in a data file: a number, or text such as "7B" or "1.5T".
ParamCount = Annotated[float, BeforeValidator(_param_count)]


def read_text(path: Path | str | None, package: str, resource: str, error: type[ValueError]
              ) -> tuple[str, str]:
    """(text, origin) of ``path``, or of the packaged resource when ``path`` is None."""
    if path is None:
        return files(package).joinpath(resource).read_text(encoding="utf-8"), f"{package}/{resource}"
    # A user's own catalog, registry or calibration: the same reader as every user file.
    return userfiles.read_user_text(path, error, MAX_DATA_FILE_BYTES), str(path)


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


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases: a few hundred bytes of nested anchors expand to gigabytes
    once the document is turned into Python objects (a "billion laughs" file)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not accepted; write the value out",
                event.start_mark)
        return super().compose_node(parent, index)


def parse_yaml(text: str, origin: str, error: type[ValueError],
               loader: type[yaml.SafeLoader] = yaml.SafeLoader) -> Any:
    """The YAML document in ``text``; a syntax error (or ``error`` from a checking loader) names
    ``origin``."""
    try:
        return yaml.load(text, Loader=loader)
    except error as exc:
        raise error(f"{origin}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML: {exc}") from exc


def load_user_yaml(path: Path | str, error: type[ValueError], max_bytes: int, *,
                   max_depth: int = MAX_DEPTH, max_nodes: int | None = None) -> Any:
    """A file a user hands a command: a regular file of at most ``max_bytes`` (counted while
    reading), UTF-8 without NUL, no anchors or aliases, nested at most ``max_depth`` deep; one line
    per problem (``app/base/userfiles.py``)."""
    return userfiles.load_user_yaml(path, error, max_bytes, max_depth=max_depth, max_nodes=max_nodes)
