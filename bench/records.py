"""Result records <-> JSON, derived from their dataclasses by pydantic: the dataclass is the one declaration.

A record is a plain dataclass with its fields documented under them; the dataclasses that are written on
their own (a result file's RunResult, a Case in an export) say `__pydantic_config__ = RECORD_CONFIG`, and
the dataclasses they hold inherit it. From that, pydantic's TypeAdapter gives

- serialisation: JSON keys are the field names with a keyword's trailing underscore dropped (`pass_` ->
  `pass`, yaml_key), plus the record's `@computed_field` properties (derived values such as a case's id,
  written for people reading the file and dropped again on reading: `DROP_DERIVED`);
- validation: strict (no "4" for 4, no 1 for true; an int is a float), no unknown keys, every error with
  its path (`cases[3].timing.median_s`) and, through `locate`, the line of the file it is on;
- the JSON Schema, with each field's docstring as its description (docs/result-schema.json).

Why pydantic (over cattrs and msgspec): it works on the stdlib dataclasses as they are (slots, frozen,
kw_only, __post_init__ checks run), validates JSON in Rust (a 140-case result file loads in tens of ms),
reports every error with its path in one pass, and emits JSON Schema itself; cattrs has no schema and
reports errors as nested exception groups; msgspec would replace the dataclasses with its own Structs.
"""

from __future__ import annotations

import functools
import json
from typing import Any, TypeVar

import torch
import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError, model_validator
from pydantic.fields import ComputedFieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from gdn_cp.dtypes import DTYPES, dtype_name
from gdn_cp.ops.backends import names_unchecked

T = TypeVar("T")


def yaml_key(field_name: str) -> str:
    """The file spelling of a field (YAML and JSON): `pass_` -> `pass` (a Python keyword)."""
    return field_name.rstrip("_")


RECORD_CONFIG = ConfigDict(
    strict=True,
    extra="forbid",
    alias_generator=yaml_key,
    validate_by_alias=True,
    validate_by_name=False,
    serialize_by_alias=True,
    use_attribute_docstrings=True,
    arbitrary_types_allowed=True,  # torch.dtype, in the layer's config: written by name (_dtype_name)
    ser_json_inf_nan="constants",  # NaN as NaN, as json.dumps writes it (a failed comparison holds one)
)
"""How every record is read and written (module docstring)."""


def _drop_derived(cls: type, data: Any) -> Any:
    """The stored mapping of `cls` without the keys its computed fields wrote (they are derived again)."""
    if not isinstance(data, dict):
        return data
    derived = {
        yaml_key(name)
        for name, value in vars(cls).items()
        if isinstance(getattr(value, "decorator_info", None), ComputedFieldInfo)
    }
    return {k: v for k, v in data.items() if k not in derived}


DROP_DERIVED = model_validator(mode="before")(classmethod(_drop_derived))
"""Put in the body of a record with `@computed_field` properties (`_derived = DROP_DERIVED`), so that
reading back what it wrote does not find unknown keys."""


def _dtype_name(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    raise TypeError(f"no JSON form for {type(value).__name__} {value!r}")


@functools.cache
def adapter(tp: Any) -> TypeAdapter[Any]:
    """The (cached) TypeAdapter of a record type: a dataclass that declares RECORD_CONFIG (one nested in such
    a record is read and written through it, which gives it the config)."""
    if vars(tp).get("__pydantic_config__") is not RECORD_CONFIG:
        raise TypeError(f"{tp.__name__} is not a record: give it __pydantic_config__ = RECORD_CONFIG")
    return TypeAdapter(tp)


def to_dict(obj: Any) -> dict[str, Any]:
    """`obj` (a record) as its JSON mapping (plain dicts, lists and scalars)."""
    return adapter(type(obj)).dump_python(obj, mode="json", fallback=_dtype_name)


def from_json(tp: type[T], text: str | bytes) -> T:
    """A record of type `tp` from JSON text; pydantic's ValidationError when the text does not match. A
    backend name nothing registered here reads as data (a result of a user's backend, read without it)."""
    with names_unchecked():
        return adapter(tp).validate_json(text)


def from_dict(tp: type[T], data: Any) -> T:
    """A record of type `tp` from its JSON mapping (as `to_dict` gives it), checked as strictly as JSON."""
    return from_json(tp, json.dumps(data))


class _SchemaGenerator(GenerateJsonSchema):
    """Pydantic's JSON Schema, with torch.dtype as its names."""

    def is_instance_schema(self, schema: core_schema.IsInstanceSchema) -> JsonSchemaValue:
        if schema["cls"] is torch.dtype:
            return {"enum": sorted(DTYPES)}
        return super().is_instance_schema(schema)

    def encode_default(self, dft: Any) -> Any:
        return super().encode_default(dtype_name(dft) if isinstance(dft, torch.dtype) else dft)


def json_schema(tp: Any) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of what `to_dict` writes for a record of type `tp`: derived keys
    included (read-only), keys whose field has a default not required."""
    return adapter(tp).json_schema(mode="serialization", schema_generator=_SchemaGenerator)


def locate(text: str, loc: tuple[int | str, ...]) -> tuple[int | None, tuple[int | str, ...]]:
    """The 1-based line in the JSON `text` of the value at `loc` (a pydantic error location), and `loc`
    without the steps that name no key (a tagged union's member; a missing key, whose line is then the
    mapping's that lacks it). JSON is YAML, whose composer keeps every node's line; it runs only when a file
    is refused, so its speed does not matter. (None, loc) where the text does not compose."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None, loc
    kept: list[int | str] = []
    for step in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == str(step)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and 0 <= step < len(node.value):
            child = node.value[step]
        if child is not None:
            node = child
            kept.append(step)
        elif not isinstance(node, yaml.MappingNode):
            break
    return (None if node is None else node.start_mark.line + 1), tuple(kept)


def describe_error(error: ValidationError, text: str) -> tuple[int | None, str]:
    """(line, "cases[3].timing.median_s: problem") of the first error pydantic found in the JSON `text`."""
    first = error.errors(include_url=False)[0]
    line, loc = locate(text, first["loc"])
    if first["type"] == "missing":
        loc = (*loc, first["loc"][-1])
    where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in loc).lstrip(".") or "the file"
    if first["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        return line, f"{where}: unknown key"
    problem = first["msg"][0].lower() + first["msg"][1:]
    if first["type"] != "missing":
        problem += f", got {json.dumps(first.get('input'), default=str)[:60]}"
    return line, f"{where}: {problem}"
