"""Paired measurement (`bench compare REF REF`): another checkout's gdn_cp loaded beside this one, both
sides' passes timed in turn in one lifetime, and a real paired compare of two commits whose layers differ."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gitrepo import git
from rich.console import Console
from tiny import TINY_LAYER, TINY_LAYER_YAML

import gdn_cp
from bench.commands import compare
from bench.commands.session import CaseChoice
from bench.errors import UserError
from bench.judge.comparison import compare_runs
from bench.launch import paired
from bench.launch.launcher import Outcome
from bench.launch.paired import PairedSession, PairedSides, check_libraries
from bench.measure.contention import Contention
from bench.measure.library import THIS, LibraryError, load_library
from bench.measure.rank import PairedCase, RankMemory, RankResults, time_passes
from bench.results.env import collect_environment, git_info
from bench.results.store import ResultWriter, RunResult, load_result
from bench.suite.config import Case, SuiteConfig
from gdn_cp.distributed import resolve_platform
from gdn_cp.layers import seeded_layer

REPO = Path(__file__).resolve().parents[3]


def checkout_copy(root: Path, *, append: str = "", module: str = "layers/gated_deltanet.py") -> Path:
    """A folder holding a copy of this checkout's gdn_cp, `append` added to its `module`."""
    shutil.copytree(REPO / "gdn_cp", root / "gdn_cp", ignore=shutil.ignore_patterns("__pycache__"))
    if append:
        path = root / "gdn_cp" / module
        path.write_text(path.read_text() + append)
    return root


def test_a_checkouts_gdn_cp_loads_beside_this_one(tmp_path: Path):
    root = checkout_copy(tmp_path / "other", append="\nCOPY_MARKER = 'the copy'\n")
    modules_before = {n: m for n, m in sys.modules.items() if n.startswith("gdn_cp")}
    copy = load_library(str(root))
    assert {n: m for n, m in sys.modules.items() if n.startswith("gdn_cp")} == modules_before
    assert sys.modules["gdn_cp"] is gdn_cp  # this checkout's package is still the one imported by name
    assert copy.config_type is not gdn_cp.GatedDeltaNetConfig and copy.seeded_layer is not seeded_layer
    assert copy.seeded_layer.__globals__["COPY_MARKER"] == "the copy"  # the copy calls its own module
    assert copy.context_parallel.__module__ == "gdn_cp.distributed.context_parallel"
    assert load_library(str(root)) is copy  # once per process
    # the same code from the same seed: the same layer, whichever copy built it
    x = torch.randn(1, 16, TINY_LAYER.hidden_size, generator=torch.Generator().manual_seed(0))
    theirs = copy.seeded_layer(copy.config(TINY_LAYER), 3)
    ours = THIS.seeded_layer(THIS.config(TINY_LAYER), 3)
    assert type(theirs) is not type(ours)
    torch.testing.assert_close(theirs(x), ours(x), rtol=0, atol=0)


def test_a_checkout_without_what_the_harness_needs_is_refused(tmp_path: Path):
    with pytest.raises(LibraryError, match="no gdn_cp/ package there"):
        load_library(str(tmp_path))
    root = checkout_copy(tmp_path / "old", append="\ndel seeded_layer\n", module="layers/__init__.py")
    with pytest.raises(LibraryError, match="has no seeded_layer"):
        load_library(str(root))
    broken = checkout_copy(tmp_path / "broken", append="\nraise RuntimeError('half-written')\n")
    with pytest.raises(
        UserError, match=r"head v2: its gdn_cp cannot be measured paired .*half-written.*--unpaired"
    ):
        check_libraries([str(broken)], ["head v2"])


@dataclasses.dataclass(frozen=True)
class _OldConfig:
    """A GatedDeltaNetConfig of before the backends: no `backend` field."""

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    chunk_size: int = 64


@dataclasses.dataclass(frozen=True)
class _OldStyle:
    """A LinearAttentionContextParallel of before overlap and backends."""

    mode: str = "ulysses"
    checkpoint_summary: bool = True
    layout: str = "contiguous"


OLD = dataclasses.replace(
    THIS, root="old-ref", config_type=_OldConfig, context_parallel=_OldStyle, options_type=None, ran=None
)


def _case(**layer) -> Case:
    return Case(
        scenario="s", mode="p2p", checkpoint=True, cp=2, seq_len=64, pass_="forward",
        layer=dataclasses.replace(TINY_LAYER, **layer), batch=1, seed=0, warmup=1, repeat=1,
    )  # fmt: skip


def test_a_field_a_ref_does_not_take_makes_the_case_not_comparable_never_dropped(tmp_path: Path, monkeypatch):
    """Issue 44: a case asking backend transformers, or overlap, of a ref whose gdn_cp has neither used to
    run that ref's own default under the case's name (the field dropped). Now the ref names what it lacks,
    the case is skipped on both sides as not comparable, and the compare counts it so."""
    plain, fla = _case(), _case(backend="transformers")
    overlapped = dataclasses.replace(plain, overlap=True)
    assert OLD.unsupported(plain) == []
    assert OLD.unsupported(fla) == ["backend 'transformers'"]
    assert OLD.unsupported(overlapped) == ["overlap True"]
    assert THIS.unsupported(fla) == THIS.unsupported(overlapped) == []
    with pytest.raises(LibraryError, match=r"old-ref: its gdn_cp has no backend 'transformers'"):
        OLD.config(fla.layer)
    with pytest.raises(LibraryError, match=r"old-ref: its gdn_cp has no overlap True"):
        OLD.style(overlapped.options)
    assert isinstance(OLD.style(plain.options), _OldStyle)

    monkeypatch.setattr(paired, "load_library", lambda root: OLD if root == "old" else THIS)
    env = collect_environment(
        resolve_platform("cpu"), device_name="cpu", threads_per_rank=1, world_sizes=[2], launcher="local"
    )
    runs = [RunResult(name="t", environment=env, suite=SuiteConfig(), scenarios={}) for _ in range(2)]
    sides = zip(("b", "h"), runs, strict=True)
    writers = [ResultWriter(tmp_path / f"{side}.json", run) for side, run in sides]
    kept = paired._runnable([plain, fla], ["old", "new"], ["v1 (base)", "HEAD (head)"], writers)
    assert kept == [plain]
    base, head = (load_result(tmp_path / f"{side}.json") for side in ("b", "h"))
    (skipped,) = base.cases
    assert skipped.status == "skipped" and head.get(skipped.key).status == "skipped"
    assert skipped.error == "not comparable: v1 (base) has no backend 'transformers'"
    comparison = compare_runs(base, head)
    assert comparison.count("not comparable") == 1 and "1 not comparable" in comparison.summary()
    assert "not compared" not in comparison.summary()


def test_two_passes_take_turns_abba_and_rounds_alternate_who_opens():
    """Repeat i runs the passes in order when i + first is even, reversed when odd; each pass its own
    samples. With 3 repeats base runs second once in a round that base opens and twice in one head opens."""
    order: list[str] = []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        passes = [(lambda n=n: order.append(n), lambda: None) for n in ("base", "head")]
        samples = time_passes(passes, 4, resolve_platform("cpu"))
        assert order == ["base", "head", "head", "base", "base", "head", "head", "base"]
        assert [len(s) for s in samples] == [4, 4] and all(t >= 0 for s in samples for t in s)
        order.clear()
        time_passes(passes, 3, resolve_platform("cpu"), first=1)
    finally:
        dist.destroy_process_group()
    assert order == ["head", "base", "base", "head", "head", "base"]


SLOW_FORWARD = """

_plain_forward = GatedDeltaNet.forward


def _slower_forward(self, *args, **kwargs):
    import time

    time.sleep(0.03)
    return _plain_forward(self, *args, **kwargs)


GatedDeltaNet.forward = _slower_forward
"""
TINY = f"""\
description: one tiny case for the paired compare test
device: cpu
{TINY_LAYER_YAML}warmup: 1
repeat: 2
rounds: 2
cp: [1, 2]
seq_len: [64]
mode: [p2p]
pass: [forward]
"""


@pytest.mark.multirank
def test_a_paired_compare_measures_each_refs_layer_in_shared_lifetimes(tmp_path: Path, monkeypatch):
    """Base and head differ in gdn_cp alone: head's forward sleeps 30 ms. Paired, both run in each lifetime
    of the ranks (cp 1 and cp 2), measured by this checkout's bench: head's passes carry the sleep, base's do
    not, and every round of a case has its partner. (Tiny passes on a shared machine sometimes take 100+ ms,
    so the check is on each side's fastest pass, not its estimate.)"""
    repo = checkout_copy(tmp_path / "repo")
    git(repo, "init", "--quiet", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "base")
    layer = repo / "gdn_cp" / "layers" / "gated_deltanet.py"
    layer.write_text(layer.read_text() + SLOW_FORWARD)
    git(repo, "commit", "--quiet", "-am", "head: a slower forward")
    base_commit, head_commit = git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    monkeypatch.chdir(repo)
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    code = compare.run(
        "HEAD~1",
        "HEAD",
        CaseChoice([str(scenario)], ["rounds=2"]),
        save_dir=str(tmp_path / "out"),
        console=console,
    )
    text = console.export_text()
    assert code == 0, text
    (base_file,) = (tmp_path / "out").glob("base-*.json")
    (head_file,) = (tmp_path / "out").glob("head-*.json")
    base, head = load_result(base_file), load_result(head_file)
    assert (base.environment.git_commit, head.environment.git_commit) == (base_commit, head_commit)
    harness = git_info()
    assert base.measured_by == head.measured_by == harness.commit + ("+dirty" if harness.dirty else "")
    assert base.session == head.session is not None and base.schedule_seed == head.schedule_seed
    assert sorted(c.case.cp for c in base.cases) == [1, 2]
    for b in base.cases:
        h = head.get(b.key)
        assert b.status == h.status == "ok", (b.error, h.error)
        assert [r.lifetime for r in b.rounds] == [r.lifetime for r in h.rounds] and len(b.rounds) == 2
        assert len({r.lifetime for r in b.rounds}) == 2  # each round a lifetime of its own
        # every head pass sleeps 30 ms (its minimum: a pass can be slowed, never sped up); base's do not,
        # so base's fastest pass is faster than head's (an order, not a wall time: a loaded machine slows
        # any pass, so medians of 4 passes can cross, the fastest cannot unless base slept too)
        head_samples = [s for r in h.rounds for s in r.samples_s[0]]
        assert min(head_samples) >= 0.03
        assert min(s for r in b.rounds for s in r.samples_s[0]) < min(head_samples)
    assert "paired: both in each lifetime of the ranks" in text
    assert git(repo, "worktree", "list").count("\n") == 0


class RecordingLauncher:
    """A stand-in launcher of paired rounds: each round's repeat recorded, `repeat` passes of 10 ms a side."""

    def __init__(self) -> None:
        self.repeats: list[int] = []

    @contextlib.contextmanager
    def pool(self, cp: int):
        yield self

    def run(self, paired: PairedCase) -> Outcome:
        self.repeats.append(paired.case.repeat)
        quiet = Contention(foreign=0.0, steal=0.0, load_before=0.0, load_after=0.0)
        side = RankResults(
            samples_s=[[0.01] * paired.case.repeat] * paired.case.cp,
            memory=RankMemory(
                peak_bytes=[1] * paired.case.cp, baseline_bytes=[0] * paired.case.cp, meter="test"
            ),
            device_name="cpu",
            threads=1,
            matmul_gflops=[1.0] * paired.case.cp,
            matmul_dtype="fp32",
            contention=quiet,
        )
        lifetime = f"lifetime {len(self.repeats)}"
        return Outcome(status="ok", results=(side, dataclasses.replace(side)), lifetime=lifetime)


def test_rounds_a_budget_adds_time_the_repeats_it_asks_for(tmp_path: Path):
    """PairedSession.run with `repeats`: those rounds time that many passes a side (each round's samples
    keep their own count); without, the case's repeat."""
    one = Case(
        scenario="tiny", mode="p2p", checkpoint=True, cp=2, seq_len=64, pass_="forward", layer=TINY_LAYER,
        batch=1, seed=0, warmup=1, repeat=3, rounds=3,
    )  # fmt: skip
    launcher = RecordingLauncher()
    env = collect_environment(
        resolve_platform("cpu"), device_name="cpu", threads_per_rank=1, world_sizes=[2], launcher="local"
    )
    writers = tuple(
        ResultWriter(
            tmp_path / f"{side}.json", RunResult(name="t", environment=env, suite=SuiteConfig(), scenarios={})
        )
        for side in ("base", "head")
    )
    session = PairedSession(cases=[one], launcher=launcher, sides=PairedSides(("a", "b"), writers), seed=0)
    session.run(1)
    base, head = session.run(3, [one.key()], repeats={one.key(): 22})
    assert launcher.repeats == [one.repeat, 22, 22]
    for run in (base, head):
        assert [len(r.samples_s[0]) for r in run.get(one.key()).rounds] == [one.repeat, 22, 22]
