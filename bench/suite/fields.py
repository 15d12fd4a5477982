"""Config fields checked against their annotations: one place, so that every config dataclass
(bench.suite.config, bench.suite.documents) reports a wrong type the same way, as
`FieldError("key", "problem; fix")`.

YAML keys are the field names, except that a trailing underscore (`pass_`, a Python keyword) is dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, get_args, get_origin

from bench.errors import FieldError
from bench.records import yaml_key


def config_fields(cls_or_obj: Any) -> tuple[dataclasses.Field, ...]:
    """The fields of a config dataclass that a YAML file sets (not the ones derived in __post_init__)."""
    return tuple(f for f in dataclasses.fields(cls_or_obj) if f.init)


def yaml_keys(cls: type) -> dict[str, str]:
    """YAML key -> field name, for the fields of a config dataclass."""
    return {yaml_key(f.name): f.name for f in config_fields(cls)}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(hint))
    if origin is list:
        return f"a list of {_describe(get_args(hint)[0])}"
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in get_args(hint) if a is not type(None)]
        return " or ".join([*parts, "null"] if type(None) in get_args(hint) else parts)
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def check_value(key: str, hint: Any, value: Any, expected: str | None = None) -> Any:
    """`value` if it matches `hint` (ints are accepted for floats), else FieldError naming key and fix.

    `expected` describes the declared type when `hint` is the inner type of an optional one."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        # `str | list[str]`: a list is checked as the list member, anything else as the other one
        if len(inner) > 1:
            lists = [a for a in inner if get_origin(a) is list]
            others = [a for a in inner if get_origin(a) is not list]
            if not (len(lists) == len(others) == 1):
                raise TypeError(f"{key}: unsupported annotation {hint!r}")  # a programming error
            inner = lists if isinstance(value, list) else others
        return check_value(key, inner[0], value, _describe(hint))
    if origin is Literal:
        choices = get_args(hint)
        if not isinstance(value, str) or value not in choices:
            raise FieldError(key, f"unknown {key} {value!r}; use one of {', '.join(choices)}")
        return value
    if origin is list:
        (item,) = get_args(hint)
        if not isinstance(value, list):
            raise FieldError(
                key, f"expected a list, got {value!r}; write a YAML list such as {key}: [{value}]"
            )
        return [check_value(key, item, v) for v in value]
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(hint)
    if ok is None:
        return value  # nested dataclasses are built and checked by their own __post_init__
    if not ok:
        raise FieldError(
            key,
            f"expected {expected or _describe(hint)}, got {value!r} ({type(value).__name__}); fix the value",
        )
    if hint is float and not math.isfinite(value):
        raise FieldError(
            key, f"expected a finite number, got {value!r}; write a plain number (not .nan or .inf)"
        )
    return float(value) if hint is float else value


def check_fields(obj: Any) -> None:
    """Check every field of a config dataclass against its annotation (converting int -> float)."""
    hints = _hints(type(obj))
    for f in config_fields(obj):
        value = check_value(yaml_key(f.name), hints[f.name], getattr(obj, f.name))
        object.__setattr__(obj, f.name, value)


def check_mapping(cls: type, values: dict[str, Any]) -> None:
    """FieldError for the first of `values` (YAML key -> value) that its field of `cls` does not allow: the
    check a class makes itself in __post_init__ (check_fields), for a class that makes none (a library
    config)."""
    hints, names = _hints(cls), yaml_keys(cls)
    for key, value in values.items():
        if key in names:
            check_value(key, hints[names[key]], value)


def require_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        values = value if isinstance(value, list) else [value]
        bad = [v for v in values if v is not None and v <= 0]
        if bad:
            raise FieldError(yaml_key(name), f"must be positive, got {bad[0]!r}; use an integer >= 1")
