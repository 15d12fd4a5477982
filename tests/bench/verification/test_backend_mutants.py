"""`bench verify`'s power against a backend's op (issue 48): a case whose backend is not gdn_cp also runs its
layer check on each of the op's built-in mutants (gdn_cp.ops.backends.mutants, on every rank), and the
check catches each; which mutants run follows the mode and the summary checkpoint
(bench.verification.mutants)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny import TINY_LAYER_YAML, tiny_scenario

from bench.commands import verify as verify_command
from bench.results.store import load_result
from bench.results.verifications import TrainVerification
from bench.suite.config import Case, Sweep
from bench.verification.mutants import case_mutants
from gdn_cp.ops.backends import mutants as backend_mutants
from tests.bench.verification.layer_check import layer_check_on_two_ranks
from tests.gdn_cp.ops.helpers import tolerance

SEQ_LEN = 32
LAYER_BAR = tolerance(torch.float32, terms=SEQ_LEN * 32)  # the tiny layer's hidden size: 32
TRAIN_BAR = tolerance(torch.float32, terms=4 * SEQ_LEN * 32)  # through the 4 layers of the hybrid model
CP_MUTANTS = ["state_dropped", "state_scaled", "state_grad_dropped", "halo_dropped"]
"""CP's mutants of a p2p case without documents (gdn_cp.distributed.mutants)."""
OP_MUTANTS = [m.name for m in backend_mutants.MUTANTS]


def _case(mode: str, backend: str, checkpoint: bool = True) -> Case:
    sweep = Sweep(
        cp=[2],
        seq_len=[SEQ_LEN],
        mode=[mode],
        backend=[backend],
        checkpoint=[checkpoint],
        pass_=["forward_backward"],
    )
    (case,) = tiny_scenario(sweep=sweep).cases(warmup=0, repeat=1)
    return case


def test_the_ops_mutants_run_where_the_op_takes_a_state():
    """gdn_cp's summary modes run its chunk stages, not its op: no op mutants. Another backend's summary modes
    reach the op with the entering state: every op mutant with checkpoint on (the op's initial_state carries
    the state's gradient there), all but the detached one with checkpoint off (the op gets a constant
    [0 | I]); ulysses never passes the op a state."""
    assert case_mutants(_case("p2p", "gdn_cp"), 2, documents=False) == CP_MUTANTS
    assert case_mutants(_case("p2p", "recurrent"), 2, documents=False) == CP_MUTANTS + OP_MUTANTS
    without_gradient = [m for m in OP_MUTANTS if m != "op_state_detached"]
    assert case_mutants(_case("p2p", "recurrent", False), 2, documents=False) == CP_MUTANTS + without_gradient
    assert case_mutants(_case("ulysses", "recurrent"), 2, documents=False) == ["heads_permuted"]
    assert case_mutants(_case("p2p", "recurrent"), 1, documents=False) == []


@pytest.mark.multirank
def test_the_layer_check_catches_every_mutant_of_a_backends_op():
    """p2p at cp 2 on backend recurrent, checkpoint on, fp32 bars from fp32's roundoff: the check passes the
    unbroken op and catches each op mutant (and CP's)."""
    case = _case("p2p", "recurrent")
    record = layer_check_on_two_ranks(case, timeout_s=120)
    assert record.passed, record.failures()
    verdicts = {v.mutant: v for v in record.power}
    assert list(verdicts) == case_mutants(case, 2, documents=True)
    assert set(OP_MUTANTS) <= set(verdicts)
    assert not [name for name, v in verdicts.items() if not v.caught], record.power
    assert verdicts["op_state_ignored"].description == "op ignores initial_state"


TRAIN = f"""\
description: the tiny layer trained on backend recurrent
{TINY_LAYER_YAML}cp: [2]
seq_len: [{SEQ_LEN}]
mode: [p2p]
backend: [recurrent]
checkpoint: [true]
pass: [forward_backward]
thresholds:
  fp32:
    train_loss_rel: {TRAIN_BAR:.2e}
    train_grad_norm_rel: {TRAIN_BAR:.2e}
    train_first_loss_rel: {TRAIN_BAR:.2e}
    train_first_grad_norm_rel: {TRAIN_BAR:.2e}
    train_first_gdn_output_rel_l2: {LAYER_BAR:.2e}
train:
  vocab_size: 64
  intermediate_size: 64
  num_attention_heads: 2
  num_key_value_heads: 1
  head_dim: 16
"""


@pytest.mark.multirank
def test_the_training_check_catches_every_mutant_of_a_backends_op(suite_dir: Path, write_scenario):
    """The training check's first step, with each op mutant on (bench.verification.train_rank), fails its
    first-step bars: caught, as CP's mutants are."""
    write_scenario("t", TRAIN)
    out = suite_dir / "t.json"
    assert verify_command.run(["t"], train=1, output=str(out)) == 0
    (record,) = load_result(out).verifications
    assert isinstance(record, TrainVerification) and record.passed
    verdicts = {v.mutant: v for v in record.power}
    assert list(verdicts) == CP_MUTANTS + OP_MUTANTS
    assert not [name for name, v in verdicts.items() if not v.caught], record.power
