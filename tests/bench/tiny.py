"""The tiny layer the bench tests run, in one place: its dimensions as Scenario fields, as the YAML lines a
scenario file starts with, and a Scenario of them. Small enough that a case takes milliseconds on a CPU, with
heads that split over 2 ranks (ulysses) and chunks of 8 so that 32-64 tokens hold several."""

from __future__ import annotations

from typing import Any

from bench.suite.config import Scenario

TINY_LAYER: dict[str, Any] = {
    "hidden_size": 32,
    "num_k_heads": 2,
    "num_v_heads": 4,
    "head_k_dim": 8,
    "head_v_dim": 8,
    "chunk_size": 8,
    "dtype": "fp32",
}
TINY_LAYER_YAML = "".join(f"{key}: {value}\n" for key, value in TINY_LAYER.items())
"""TINY_LAYER as the lines of a scenario file (put first: a scenario's text adds its sweep below)."""


def tiny_scenario(**fields: Any) -> Scenario:
    """A Scenario named `s` of the tiny layer; `fields` add to or override it (sweep=..., dtype=...)."""
    return Scenario(name="s", **{**TINY_LAYER, **fields})
