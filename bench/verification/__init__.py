"""`bench verify`'s rank side: accuracy of CP against the single-device reference, the reference PR's study.

- `compare_on_rank` (layer_rank.py): the CP layer vs the full-sequence reference, per seed, on every rank.
- `train_on_rank` (train_rank.py): the hybrid model trained under CP vs the single-rank reference.
- bench.results.verifications: what is stored per case (LayerVerification, TrainVerification).
- bench.judge.verification and bench.render.verification: the reference-shaped tables, as numbers and as
  cells, for the terminal and for `bench report`.
"""

from bench.results.verifications import (
    LayerVerification,
    TrainVerification,
    Trajectory,
    Verification,
    error_growth,
)
from bench.verification.layer_rank import LayerHook, compare_on_rank
from bench.verification.train_rank import train_on_rank

__all__ = [
    "LayerHook",
    "LayerVerification",
    "TrainVerification",
    "Trajectory",
    "Verification",
    "compare_on_rank",
    "error_growth",
    "train_on_rank",
]
