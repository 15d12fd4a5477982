"""`bench verify`: accuracy of CP against the single-device reference, the seed's study as a command.

- `compare_on_rank` (layer.py): the CP layer vs the full-sequence reference, per seed, on every rank.
- `train_on_rank` (training.py): the hybrid model trained under CP vs the single-rank reference.
- records.py: what is stored per case (LayerVerification, TrainVerification) in RunResult.verifications.
- summary.py, tables.py: the seed-shaped tables, for the terminal and for `bench report`.
"""

from bench.verification.layer import LayerHook, compare_on_rank
from bench.verification.records import (
    LayerVerification,
    TrainVerification,
    Verification,
    error_growth,
    verification_from_dict,
)
from bench.verification.tables import document_blocks, print_tables, verification_tables
from bench.verification.training import Trajectory, train_on_rank

__all__ = [
    "LayerHook",
    "LayerVerification",
    "TrainVerification",
    "Trajectory",
    "Verification",
    "compare_on_rank",
    "document_blocks",
    "error_growth",
    "print_tables",
    "train_on_rank",
    "verification_from_dict",
    "verification_tables",
]
