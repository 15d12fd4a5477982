"""Pass bars of `bench verify`, as a scenario writes them: one set for every dtype, refined per dtype.

    thresholds:                 # every key optional; unset bars keep gdn_cp.accuracy.Thresholds' defaults
      grad_norm_rel: 1.0e-2     # a bar at the top level holds for every dtype ...
      fp32:                     # ... and a dtype's own mapping overrides it for cases of that dtype
        rel_l2: 1.0e-4
        param_rel_l2: 1.0e-4
      bf16: {}                  # (the reference PR's bars)

Resolution for a case of dtype d: the defaults (the reference PR's bf16 bars for the layer, TRAIN_DEFAULTS for
the trajectory), then the top-level bars, then the bars under d (any spelling: fp32 or float32).

Layer bars (the fields of gdn_cp.accuracy.Thresholds): output_max_abs, input_grad_max_abs, rel_max, rel_l2,
output_rel_l2 (the output's own; rel_l2 unless set), param_rel_max, param_rel_l2, grad_norm_rel. Trajectory
bars (`bench verify --train`): train_loss_rel (max over steps of |loss_cp - loss_ref| / |loss_ref|) and
train_grad_norm_rel (the same for the global gradient norm); the first step's: train_first_loss_rel,
train_first_grad_norm_rel, train_first_gdn_output_rel_l2. The reference PR reported its 100-step
trajectory without bars; TRAIN_DEFAULTS are ours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bench.errors import FieldError, suggest
from gdn_cp.accuracy import Thresholds, TrainThresholds
from gdn_cp.dtypes import DTYPES, dtype_name, to_dtype

LAYER_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Thresholds))
"""Bars of the layer comparison (gdn_cp.accuracy.Thresholds)."""


TRAIN_KEYS: dict[str, str] = {f"train_{f.name}": f.name for f in dataclasses.fields(TrainThresholds)}
"""Scenario key -> TrainThresholds field."""
ALL_KEYS: tuple[str, ...] = LAYER_KEYS + tuple(TRAIN_KEYS)


@dataclass(frozen=True, slots=True)
class Bars:
    """The bars that apply to one dtype."""

    layer: Thresholds
    train: TrainThresholds


def _check_bars(where: str, raw: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in raw.items():
        if key not in ALL_KEYS:
            raise FieldError("thresholds", f"{where}{key}: unknown bar; {suggest(str(key), ALL_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise FieldError(
                "thresholds", f"{where}{key}: expected a positive number, got {value!r}; e.g. {key}: 1.0e-2"
            )
        out[key] = float(value)
    return out


@dataclass(frozen=True, slots=True)
class ThresholdSpec:
    """A scenario's `thresholds` mapping, checked: bars for every dtype, and per-dtype refinements."""

    common: dict[str, float] = field(default_factory=dict)
    """Bars set at the top level of the mapping."""
    per_dtype: dict[str, dict[str, float]] = field(default_factory=dict)
    """Short dtype name (fp32, bf16, ...) -> the bars set under it."""

    @classmethod
    def parse(cls, raw: dict[str, Any] | None) -> ThresholdSpec:
        """Check a `thresholds` mapping; FieldError("thresholds", ...) naming the bad key and the fix."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise FieldError(
                "thresholds", f"expected a mapping of bars such as {{rel_l2: 1.0e-2}}, got {raw!r}"
            )
        common: dict[str, Any] = {}
        per_dtype: dict[str, dict[str, float]] = {}
        for key, value in raw.items():
            if isinstance(key, str) and key.lower() in DTYPES:
                if not isinstance(value, dict):
                    raise FieldError(
                        "thresholds",
                        f"{key}: expected a mapping of bars for {key} cases, e.g. {key}: {{rel_l2: 1.0e-4}}",
                    )
                name = dtype_name(to_dtype(key))
                if name in per_dtype:
                    raise FieldError("thresholds", f"{key}: bars for {name} are given twice; merge them")
                per_dtype[name] = _check_bars(f"{key}.", value)
            else:
                common[key] = value
        return cls(common=_check_bars("", common), per_dtype=per_dtype)

    def for_dtype(self, dtype: str) -> Bars:
        """The bars for cases of `dtype`: defaults, then the top-level bars, then the dtype's own."""
        merged = {**self.common, **self.per_dtype.get(dtype_name(to_dtype(dtype)), {})}
        layer = Thresholds(**{k: v for k, v in merged.items() if k in LAYER_KEYS})
        train = TrainThresholds(**{TRAIN_KEYS[k]: v for k, v in merged.items() if k in TRAIN_KEYS})
        return Bars(layer=layer, train=train)
