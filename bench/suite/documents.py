"""Packed documents of a scenario: how many, how their lengths are drawn, and the global boundaries
(`cu_seqlens`, [0, ..., seq_len]) that a case passes to the layer on every rank.

YAML: a `documents:` mapping, e.g. `{count: 64, lengths: lognormal, seed: 0}`, or a list of them (null:
one unpacked sequence) to compare packed and unpacked side by side (bench.suite.config.Sweep.documents).

Lengths (every document >= 1 token, summing exactly to seq_len):
    fixed      as equal as possible: seq_len // count each, the first seq_len % count one token longer
    uniform    weights drawn uniformly from [0, 1)
    lognormal  weights drawn from a log-normal distribution, log-weights ~ Normal(0, sigma) (a few long
               documents and many short ones, as real training batches have)
For the random ones each document gets 1 token, and the other seq_len - count tokens are shared in
proportion to the weights (the running sum of the weights rounded), so the boundaries are a pure function
of (count, lengths, seed, sigma, seq_len): the same on every rank, host and run (random.Random, whose
seeded sequence Python keeps stable).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any, Literal

from bench.errors import FieldError, suggest
from bench.suite.fields import check_fields, yaml_keys

LengthDistribution = Literal["fixed", "uniform", "lognormal"]
"""How document lengths are drawn (module docstring)."""
RANDOM_LENGTHS: tuple[str, ...] = ("uniform", "lognormal")
"""The distributions that draw from `seed`."""
EXAMPLE = "{count: 64, lengths: lognormal, seed: 0}"
"""A valid `documents:` mapping, for error messages."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Documents:
    """Documents packed into one sequence (batch 1): the layer gets their global boundaries as cu_seqlens."""

    count: int
    """Documents in the sequence, 1 .. seq_len (every document holds at least one token)."""
    lengths: LengthDistribution = "fixed"
    """How their lengths are drawn: fixed (as equal as possible), uniform or lognormal."""
    seed: int = 0
    """Seed of the random lengths (uniform, lognormal); fixed ignores it."""
    sigma: float = 1.0
    """lognormal: the standard deviation of the log-lengths (larger: more uneven documents)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.count < 1:
            raise FieldError("count", f"must be >= 1, got {self.count}; e.g. count: 64")
        if self.sigma <= 0:
            raise FieldError("sigma", f"must be > 0, got {self.sigma}; e.g. sigma: 1.0")

    @property
    def tag(self) -> str:
        """How case ids spell it: `docs64-lognormal`, with `-seed<s>` / `-sigma<x>` where they are not the
        defaults and matter (random lengths), so that two different packings never share an id."""
        out = f"docs{self.count}-{self.lengths}"
        if self.lengths in RANDOM_LENGTHS and self.seed != 0:
            out += f"-seed{self.seed}"
        if self.lengths == "lognormal" and self.sigma != 1.0:
            out += f"-sigma{self.sigma:g}"
        return out

    def check(self, seq_len: int) -> None:
        """FieldError("count", ...) unless `count` documents of >= 1 token fit in `seq_len` tokens."""
        if self.count > seq_len:
            raise FieldError(
                "count",
                f"{self.count} documents do not fit in a sequence of {seq_len} tokens (every document holds "
                f">= 1 token); use count <= {seq_len}, or a longer seq_len",
            )

    def document_lengths(self, seq_len: int) -> list[int]:
        """[count] tokens per document, each >= 1, summing to `seq_len` (module docstring)."""
        self.check(seq_len)
        n = self.count
        if self.lengths == "fixed":
            q, r = divmod(seq_len, n)
            return [q + (i < r) for i in range(n)]
        rng = random.Random(self.seed)
        if self.lengths == "uniform":
            weights = [rng.random() for _ in range(n)]
        else:
            weights = [rng.lognormvariate(0.0, self.sigma) for _ in range(n)]
        return [1 + extra for extra in _share(seq_len - n, weights)]

    def bounds(self, seq_len: int) -> list[int]:
        """[count + 1] global boundaries 0 = b[0] < ... < b[count] = seq_len (the layer's cu_seqlens)."""
        return [0, *accumulate(self.document_lengths(seq_len))]


def _share(total: int, weights: list[float]) -> list[int]:
    """`total` split into integers >= 0 in proportion to `weights` (>= 0; equal shares when all are 0),
    summing exactly to `total`: the running sum of the weights is rounded, so rounding never accumulates."""
    weight_sum = math.fsum(weights)
    if weight_sum <= 0:
        weights, weight_sum = [1.0] * len(weights), float(len(weights))
    running = list(accumulate(weights))
    cuts = [0, *(min(total, round(total * c / weight_sum)) for c in running[:-1]), total]
    return [b - a for a, b in pairwise(cuts)]


def parse_documents(value: Any) -> Documents | None:
    """One `documents:` entry: None (unpacked), a Documents, or its YAML mapping. FieldError("documents",
    ...) naming the inner key and the fix otherwise."""
    if value is None or isinstance(value, Documents):
        return value
    if not isinstance(value, dict):
        raise FieldError(
            "documents", f"expected a mapping such as {EXAMPLE}, or null (unpacked), got {value!r}"
        )
    known = yaml_keys(Documents)
    for key in value:
        if key not in known:
            raise FieldError("documents", f"{key}: unknown key; {suggest(str(key), known)}")
    if "count" not in value:
        raise FieldError("documents", f"count: required but missing; e.g. documents: {EXAMPLE}")
    try:
        return Documents(**value)
    except FieldError as exc:
        raise FieldError("documents", f"{exc.key}: {exc.message}") from None


def documents_tag(documents: Documents | None) -> str:
    """`docs64-lognormal`, or `none` for an unpacked sequence (filters, tables, export)."""
    return "none" if documents is None else documents.tag
