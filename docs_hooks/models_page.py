"""Field tables of pydantic models (each key, its type, default and description), for the config and format
reference pages: a page names a model with `<!-- seqrec:fields module:Model [prefix] -->` and the hook puts the
table there, nested models as `section.key` rows."""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"<!-- seqrec:(fields|dataclass) ([\w.]+):(\w+)(?: (\S+))? -->")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type(annotation: Any) -> str:
    """`int | None`, `auto | exclude | allow`, `tuple[float, float]`: the annotation as a reader writes it."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    """`>= 1`, `> 0, < 1`: the field's numeric constraints."""
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = [f"{words[k]} {getattr(m, k)}" for m in info.metadata for k in words if hasattr(m, k)]
    return f" ({', '.join(found)})" if found else ""


def _default(info: FieldInfo) -> str:
    if info.default is not PydanticUndefined:
        value = info.default
        return f"`{value.get_secret_value() if hasattr(value, 'get_secret_value') else value}`"
    if info.default_factory is not None:
        try:
            return f"`{info.default_factory()}`"  # type: ignore[call-arg]
        except TypeError:  # computed from the other fields (the description says how)
            return "computed"
    return "required"


def _nested(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every field, a nested model's fields under `key.`."""
    out = []
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}".upper() if prefix.isupper() else f"{prefix}{name}"  # SEQREC_: variables
        nested = _nested(info.annotation)
        if nested is not None:
            out.append((key, nested.__name__, "", info.description or (nested.__doc__ or "").strip()))
            out += rows(nested, f"{key}.")
        else:
            out.append((key, _type(info.annotation) + _bounds(info), _default(info), info.description or ""))
    return out


def dataclass_rows(cls: Any, prefix: str = "") -> list[tuple[str, str, str, str]]:
    out = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        out.append((f"{prefix}{f.name}", _type(f.type), f"`{default}`" if default != "required" else default,
                    str(f.metadata.get("description", ""))))
    return out


def table(found: list[tuple[str, str, str, str]]) -> str:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    lines += [f"| `{k}` | {t} | {_cell(d)} | {_cell(text)} |" for k, t, d, text in found]
    return "\n".join(lines)


def expand(markdown: str) -> str:
    """Replace each marker with the named model's table (an unknown model fails the build)."""
    def one(match: re.Match[str]) -> str:
        kind, module, name, prefix = match.groups()
        cls = getattr(importlib.import_module(module), name)
        found = rows(cls, prefix or "") if kind == "fields" else dataclass_rows(cls, prefix or "")
        return table(found)

    return MARKER.sub(one, markdown).replace("<!-- seqrec:backbones -->", backbones())


def backbones() -> str:
    """One table per registered backbone: the options its config takes beside `model.backbone`."""
    from retriever.backbones import BACKBONES

    parts = []
    for name, (config_cls, _) in BACKBONES.items():
        found = [row for row in dataclass_rows(config_cls, "model.") if row[0] != "model.n_items"]
        parts += [f"#### `{name}`", "", table(found), ""]
    return "\n".join(parts)
