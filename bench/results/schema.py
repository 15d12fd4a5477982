"""The JSON Schema of result files, generated from the dataclasses that write them, and a validator for it.

`result_schema()` walks the fields and type hints of RunResult (bench.results.store) and everything it holds
(Environment, CaseResult and the Case it ran, TimingSummary, MemoryResult, ThroughputResult, the records of
`bench verify`), with each field's docstring as its description. What the dataclasses do not say is in
SPECS: the JSON names of renamed fields (a CaseResult's `case` is `params`), the keys `to_dict` adds
(derived values such as `case_id`), the keys that files written before they existed lack (optional), and
free-form dicts that hold a known dataclass (`suite` is a SuiteConfig). docs/result-schema.json is its
output (`python -m bench.results.schema > docs/result-schema.json`); a test regenerates it, so it cannot go
stale.

`validate(instance, schema)` checks a value against the subset of JSON Schema that result_schema emits
(type, enum, const, properties, required, additionalProperties, items, anyOf, local $ref), so that no
dependency is needed to check a file.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from bench.measure.contention import Contention
from bench.results.env import Environment
from bench.results.store import (
    SCHEMA_VERSION,
    CaseResult,
    MemoryResult,
    RunResult,
    ThroughputResult,
)
from bench.results.verifications import LayerVerification, TrainVerification
from bench.suite.config import Case, SuiteConfig, TrainSettings, yaml_key
from gdn_cp.accuracy import LayerComparison

DRAFT = "https://json-schema.org/draft/2020-12/schema"

Schema = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Spec:
    """How a dataclass is written to JSON, where its fields and hints do not say it."""

    rename: Mapping[str, str] = field(default_factory=dict)
    """Field name -> JSON key (default: the YAML spelling, `pass_` -> `pass`)."""
    extra: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    """Keys `to_dict` writes that are not fields: JSON key -> (type hint, description)."""
    types: Mapping[str, Any] = field(default_factory=dict)
    """Field name -> the type its JSON value has, where the annotation is looser (a dict of a dataclass)."""
    optional: frozenset[str] = frozenset()
    """JSON keys that files written before they existed lack (every other key is required)."""
    drop: frozenset[str] = frozenset()
    """Fields that are not written."""


SPECS: dict[type, Spec] = {
    RunResult: Spec(
        types={"suite": SuiteConfig, "schema_version": Literal[SCHEMA_VERSION]},
        optional=frozenset({"verifications", "command"}),
    ),
    CaseResult: Spec(rename={"case": "params"}, optional=frozenset({"throughput", "contention"})),
    Contention: Spec(optional=frozenset({"window", "earlier"})),
    Environment: Spec(optional=frozenset({"nodes"})),
    ThroughputResult: Spec(optional=frozenset({"matmul_dtype"})),
    MemoryResult: Spec(optional=frozenset({"device_used_bytes"})),
    Case: Spec(
        extra={
            "case_id": (str, "Stable and readable id, e.g. `p2p-ckpt-cp4-T32768-fwd_bwd` (derived)."),
            "local_seq_len": (int, "Tokens per rank: seq_len // cp (derived)."),
        },
        optional=frozenset({"dtype_in_id", "layout", "documents", "rounds", "overlap", "precision"}),
    ),
    LayerVerification: Spec(
        rename={"case": "params"},
        extra={
            "kind": (Literal["layer"], "The record's kind: a layer comparison."),
            "passed": (bool, "ok and no metric above its bar (derived)."),
            "failures": (dict[str, list[str]], "Seed -> the metrics above their bars (derived)."),
        },
    ),
    TrainVerification: Spec(
        rename={"case": "params"},
        types={"settings": TrainSettings},
        extra={
            "kind": (Literal["train"], "The record's kind: a training trajectory."),
            "passed": (bool, "ok and no failed check (derived)."),
            "failures": (list[str], "Every failed check (derived)."),
        },
    ),
    LayerComparison: Spec(
        extra={"grad_norm_rel": (float, "|grad_norm_cp - grad_norm_ref| / grad_norm_ref.")}
    ),
}
"""The dataclasses whose JSON form differs from their fields; any other dataclass is written as its fields."""

ROOT = RunResult


def _docstring(obj: Any) -> str:
    """A docstring as one paragraph of plain text."""
    return " ".join(inspect.cleandoc(obj).split()) if obj else ""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under its line in the class body (the project's way of documenting a
    field), for `cls` and the dataclasses it inherits from."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, [*body[1:], None], strict=True):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                out[node.target.id] = _docstring(after.value.value)
    return out


class _Builder:
    """Builds the schema of a type, collecting every dataclass it reaches under $defs."""

    def __init__(self) -> None:
        self.defs: dict[str, Schema] = {}

    def of(self, hint: Any) -> Schema:
        """The schema of a value of type `hint`."""
        origin = get_origin(hint)
        if hint is Any:
            return {}
        if hint is type(None):
            return {"type": "null"}
        if origin is Literal:
            values = list(get_args(hint))
            return {"const": values[0]} if len(values) == 1 else {"enum": values}
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [self.of(a) for a in get_args(hint)]}
        if origin is list:
            (item,) = get_args(hint)
            return {"type": "array", "items": self.of(item)}
        if origin is dict:
            key, value = get_args(hint)
            if key is not str:
                raise TypeError(f"JSON object keys are strings, not {key!r}")
            return {"type": "object", "additionalProperties": self.of(value)}
        if hint is dict:
            return {"type": "object"}
        if dataclasses.is_dataclass(hint):
            self._define(hint)
            return {"$ref": f"#/$defs/{hint.__name__}"}
        simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
        if hint in simple:
            return {"type": simple[hint]}
        raise TypeError(f"no JSON Schema for {hint!r}")

    def _define(self, cls: type) -> None:
        name = cls.__name__
        if name in self.defs:
            return
        self.defs[name] = {}  # placeholder: a dataclass that reaches itself refers to its own name
        spec = SPECS.get(cls, Spec())
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        properties: dict[str, Schema] = {}
        for f in dataclasses.fields(cls):
            if f.name in spec.drop or not f.init:
                continue
            key = spec.rename.get(f.name, yaml_key(f.name))
            schema = self.of(spec.types.get(f.name, hints[f.name]))
            if docs.get(f.name):
                schema = {"description": docs[f.name], **schema}
            properties[key] = schema
        for key, (hint, description) in spec.extra.items():
            properties[key] = {"description": description, **self.of(hint)}
        self.defs[name] = {
            "description": _docstring(cls.__doc__),
            "type": "object",
            "properties": properties,
            "required": [k for k in properties if k not in spec.optional],
            "additionalProperties": False,
        }


def result_schema() -> Schema:
    """The JSON Schema (draft 2020-12) of a result file of schema_version SCHEMA_VERSION."""
    builder = _Builder()
    root = builder.of(ROOT)
    return {
        "$schema": DRAFT,
        "title": f"bench result file (schema_version {SCHEMA_VERSION})",
        "description": "What `bench run` and `bench verify` write (bench/results/store.py); generated by "
        "bench.results.schema.result_schema from the dataclasses, do not edit by hand.",
        **root,
        "$defs": dict(sorted(builder.defs.items())),
    }


def schema_text() -> str:
    """result_schema() as the text of docs/result-schema.json."""
    return json.dumps(result_schema(), indent=2) + "\n"


# ----------------------------------------------------------------------------------------------------------
# Validation


_TYPES: dict[str, Any] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def validate(instance: Any, schema: Schema, root: Schema | None = None, where: str = "$") -> list[str]:
    """Every place where `instance` breaks `schema`, as "path: problem" lines (empty: it is valid). Knows
    the keywords result_schema emits; `root` holds the $defs that `$ref`s point into (default `schema`)."""
    root = schema if root is None else root
    if "$ref" in schema:
        prefix = "#/$defs/"
        ref = schema["$ref"]
        if not ref.startswith(prefix):
            raise ValueError(f"only local $defs references are supported, not {ref}")
        return validate(instance, root["$defs"][ref[len(prefix) :]], root, where)
    if "anyOf" in schema:
        branches = [validate(instance, s, root, where) for s in schema["anyOf"]]
        if not all(branches):
            return []
        if instance is not None:  # `X | None` and a value: what is wrong with it as an X
            others = [b for s, b in zip(schema["anyOf"], branches, strict=True) if s != {"type": "null"}]
            if len(others) == 1:
                return others[0]
        closest = min(branches, key=len)
        return [f"{where}: matches none of {len(branches)} alternatives; closest: {closest[0]}"]
    if "const" in schema and instance != schema["const"]:
        return [f"{where}: expected {schema['const']!r}, got {instance!r}"]
    if "enum" in schema and instance not in schema["enum"]:
        return [f"{where}: expected one of {schema['enum']}, got {instance!r}"]
    kind = schema.get("type")
    if kind is not None and not _TYPES[kind](instance):
        return [f"{where}: expected {kind}, got {type(instance).__name__} {instance!r:.60}"]
    errors: list[str] = []
    if kind == "array" and "items" in schema:
        for i, item in enumerate(instance):
            errors += validate(item, schema["items"], root, f"{where}[{i}]")
    if kind == "object":
        properties = schema.get("properties", {})
        errors += [f"{where}: missing key {k!r}" for k in schema.get("required", []) if k not in instance]
        extra = schema.get("additionalProperties", True)
        for key, value in instance.items():
            if key in properties:
                errors += validate(value, properties[key], root, f"{where}.{key}")
            elif extra is False:
                errors.append(f"{where}: unknown key {key!r}")
            elif isinstance(extra, dict):
                errors += validate(value, extra, root, f"{where}.{key}")
    return errors


if __name__ == "__main__":
    print(schema_text(), end="")
