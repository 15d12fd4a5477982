"""The tiny layer the bench tests run, in one place: its config, the YAML lines a scenario file starts with,
and a Scenario of it. Small enough that a case takes milliseconds on a CPU, with heads that split over 2 ranks
(ulysses) and chunks of 8 so that 32-64 tokens hold several."""

from __future__ import annotations

from typing import Any

from bench.suite.config import Scenario
from gdn_cp import GatedDeltaNetConfig

TINY_SIZES: dict[str, Any] = {
    "hidden_size": 32,
    "num_k_heads": 2,
    "num_v_heads": 4,
    "head_k_dim": 8,
    "head_v_dim": 8,
    "chunk_size": 8,
}
TINY_LAYER = GatedDeltaNetConfig(**TINY_SIZES)
"""The tiny layer, in fp32 (a Case's `layer`; a Scenario's, whose dtype is swept)."""
TINY_LAYER_YAML = "".join(f"{key}: {value}\n" for key, value in TINY_SIZES.items()) + "dtype: fp32\n"
"""The tiny layer as the lines of a scenario file (put first: a scenario's text adds its sweep below)."""


def tiny_scenario(**fields: Any) -> Scenario:
    """A Scenario named `s` of the tiny layer; `fields` add to or override it (sweep=..., dtype=...)."""
    return Scenario(name="s", **{"layer": TINY_LAYER, **fields})
