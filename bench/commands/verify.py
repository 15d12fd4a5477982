"""`bench verify SCENARIO ...`: the reference PR's accuracy study (sections 1 and 2) as a command.

Layer (default): for every mode x CP degree x dtype x summary checkpoint x sequence length (x layout x
documents) of the scenarios, one launch of `cp` ranks runs gdn_cp.accuracy.compare_layer_under_cp for each
seed (`--seeds N`: seeds seed .. seed + N - 1; in the case's layout, and with packed documents against the
single-device layer on each document on its own): output and input gradient (max-abs, max
relative to the reference's scale, rel-L2), every parameter gradient (the same, present and finite) and the
global gradient norm, against the bars of the scenario's `thresholds` (bench/suite/thresholds.py; unset bars
are the reference PR's).

Trajectory (`--train [STEPS]`): per case, the hybrid model of the scenario's `train:` section trained with
AdamW on new random batches every step, the single-rank reference (rank 0, full sequence) against the CP
model (gradients summed by FSDP2 or an all-reduce), initial weights checked bit-identical before step 0;
per step the loss and the global gradient norm of both (bench/verification/training.py).

Power: each case's check also runs with CP broken on purpose, one built-in mutant at a time on rank 1
(gdn_cp.distributed.mutants: the entering state dropped or x 0.99, its gradient not sent back, the conv
halo dropped, a document boundary moved, a summary slot duplicated, the heads' all-to-all permuted; those
that apply to the case's mode), cheaply: the first seed; for training, the first step. The layer check runs
on "state" inputs (gdn_cp.accuracy.state_inputs: decays that make the state entering a rank carry a share of
its output, reported per rank), also packed in documents across rank edges, with the reference PR's inputs
beside them (its table); training adds a first step on models with such decays, against per-dtype bars
(train_first_loss_rel, train_first_grad_norm_rel). A check reads "pass (caught 5/5 mutants)", or "pass, no
power against: ..." when a mutant got through.

Records go to a result file (RunResult.verifications) with the same environment record as `bench run`.
Exit code: 0 when every check passed and caught every mutant; 3 when a check failed (a metric above its
bar, unequal initial weights) -- this takes precedence; 2 when no check failed but some case failed to run
(a rank raised, died or timed out); 4 when every check that ran passed but one passed a mutant too (no
power against it: its bars or inputs cannot see that bug); 1 for a user error; 130 when interrupted. Under
torchrun every case with cp up to the job's size runs, each in a group of its own over global ranks
0 .. cp - 1 (`--train`: FSDP2 over a device mesh of that group), as `bench run` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from torch.distributed import ProcessGroup

from bench.commands import common_args
from bench.commands.session import CaseChoice, Session
from bench.console import CaseProgress, print_path
from bench.console import console as default_console
from bench.errors import UserError, first_line
from bench.formats import fit_parts
from bench.launch.launcher import (
    LocalLauncher,
    Outcome,
    RankFn,
    TorchrunLauncher,
)
from bench.render.tables import print_tables
from bench.render.verification import power_text, verification_tables
from bench.results.store import ResultWriter
from bench.results.verifications import run_name
from bench.suite.config import Case, Scenario, TrainSettings
from bench.suite.loader import ConfigError, display
from bench.suite.selection import Selection
from bench.verification import (
    LayerHook,
    LayerVerification,
    TrainVerification,
    Verification,
    compare_on_rank,
    train_on_rank,
)
from gdn_cp.distributed import DEFAULT_LAYOUT

NAME = "verify"
HELP = (
    "Verify CP against the single-device reference: the layer per mode with pass/fail bars (--seeds N for a "
    "sweep), or a training trajectory of the hybrid model (--train STEPS); each check also runs with CP "
    "broken by built-in mutants and reports its power (exit 4: a check passed a mutant)."
)

EXIT_CHECK_FAILED = 3
"""A check failed: a metric above its bar, or initial weights that differ."""
EXIT_NOT_RUN = 2
"""No check failed, but some case did not run (as `bench run` reports failed cases)."""
EXIT_NO_POWER = 4
"""Every check passed and every case ran, but a check also passed with CP broken by a mutant: a pass that
could not have failed on that bug."""
TRAIN_FROM_SCENARIO = "scenario"
"""`--train` without a number: the steps of the scenario's `train:` section (train.steps)."""


def train_steps(text: str) -> int | str:
    """--train's argparse type: a number of steps, or TRAIN_FROM_SCENARIO (argparse passes a string const
    through the type too)."""
    if text == TRAIN_FROM_SCENARIO:
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of steps") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Each check also runs once per built-in mutant that applies to its case (CP broken on rank 1: the "
        "entering state dropped or x 0.99, its gradient not sent back, the conv halo dropped, a document "
        "boundary moved, a summary slot duplicated, the heads' all-to-all permuted) and says how many it "
        'caught; one that passes a mutant reads "pass, no power against: ...". '
        f"Exit codes: 0 every check passed and caught every mutant; {EXIT_CHECK_FAILED} a check failed; "
        f"{EXIT_NOT_RUN} a case failed to run; {EXIT_NO_POWER} every check passed, but one also passed a "
        "mutant (no power against it); 1 user error; 130 interrupted."
    )
    common_args.add_scenarios(parser, "scenario names or .yaml paths (e.g. cpu-verify)")
    common_args.add_device(parser)
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="seeds per case (the scenario's seed and the next N-1); N > 1 adds the PR's sweep table",
    )
    parser.add_argument(
        "--train",
        type=train_steps,
        nargs="?",
        const=TRAIN_FROM_SCENARIO,
        default=None,
        metavar="STEPS",
        help="verify a training trajectory of the hybrid model instead of the layer: STEPS AdamW steps "
        "(default: the scenario's train.steps)",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="result file, which must not exist (default: <results_dir>/<date>-<branch>-<commit>-verify-"
        "....json, -2, -3, ... added when taken)",
    )
    common_args.add_config(parser)
    common_args.add_backend_modules(parser)


def main(args: argparse.Namespace) -> int:
    return run(
        args.scenarios,
        sets=args.sets,
        filters=args.filters,
        seeds=args.seeds,
        train=args.train,
        device=args.device,
        output=args.output,
        config=args.config,
    )


def verification_cases(cases: Sequence[Case]) -> list[Case]:
    """The cases to verify: verify always runs forward and backward, so cases that differ only in their
    timed pass are one; warmup and repeat (timing) do not apply."""
    out: dict[str, Case] = {}
    for c in cases:
        case = dataclasses.replace(c, pass_="forward_backward", warmup=0, repeat=1)
        out.setdefault(case.key(), case)
    return list(out.values())


def _train_rank(
    case: Case,
    device_kind: str,
    *,
    settings: dict[str, TrainSettings],
    steps: dict[str, int],
    group: ProcessGroup | None = None,
) -> object:
    """Rank function of `--train`: the settings and steps of the case's scenario (module level: ranks import
    it); `group` as the layer comparison's."""
    return train_on_rank(
        case, device_kind, settings=settings[case.scenario], steps=steps[case.scenario], group=group
    )


def _layer_rank(
    case: Case,
    device_kind: str,
    *,
    seeds: dict[str, list[int]],
    layer_hook: LayerHook | None,
    group: ProcessGroup | None = None,
) -> object:
    """Rank function of the layer comparison: the case's scenario's seeds (module level: ranks import it);
    `group`: the case's own group inside a torchrun job (any cp up to its size), None in a pool of cp."""
    return compare_on_rank(case, device_kind, seeds=seeds[case.scenario], layer_hook=layer_hook, group=group)


def _check_train(sel: Selection, train: int | str) -> tuple[TrainSettings, int]:
    """The scenario's train settings and the steps to run; ConfigError when it cannot train its cases."""
    settings = sel.scenario.train
    if settings is None:
        raise ConfigError(
            f"{display(sel.path)}: train: the scenario has no train: section for --train; add one (its keys "
            "are bench.suite.config.TrainSettings, e.g. train: {intermediate_size: 256, "
            "num_attention_heads: 4})"
        )
    heads = settings.num_attention_heads
    for case in sel.cases:
        if case.input_tag:  # the hybrid model's CP (gdn_cp.models) shards contiguously, one sequence
            raise ConfigError(
                f"{display(sel.path)}: {'layout' if case.layout != DEFAULT_LAYOUT else 'documents'}: --train "
                f"trains contiguous shards of unpacked sequences, not case {case.case_id}; --filter "
                "layout=contiguous,documents=none, or verify the layer without --train"
            )
        if heads % case.cp:
            raise ConfigError(
                f"{display(sel.path)}: train.num_attention_heads: {heads} full-attention heads do not "
                f"split over cp={case.cp} (case {case.case_id}); choose a multiple of every cp, or --filter "
                "the case out"
            )
    steps = settings.steps if train == TRAIN_FROM_SCENARIO else int(train)
    if steps < 1:
        raise UserError(f"--train {train}: give a positive number of steps, e.g. --train 100")
    return settings, steps


def _record(
    case: Case, scenario: Scenario, outcome: Outcome, *, seeds: Sequence[int], steps: int | None
) -> Verification:
    """The stored record of one launch."""
    bars = scenario.bars(case.dtype)
    # the rank's LayerRuns or Trajectory fields are the record's measurement fields (comparisons, losses,
    # norms, ...), copied field by field: asdict would turn its nested records into plain dicts
    fields = {}
    if outcome.status == "ok":
        fields = {f.name: getattr(outcome.results, f.name) for f in dataclasses.fields(outcome.results)}
    if steps is None:
        return LayerVerification(
            case=case,
            status=outcome.status,
            seeds=list(seeds),
            thresholds={k: v for k, v in dataclasses.asdict(bars.layer).items() if v is not None},
            error=outcome.error,
            wall_s=outcome.wall_s,
            **fields,
        )
    assert scenario.train is not None
    return TrainVerification(
        case=case,
        status=outcome.status,
        steps=steps,
        settings=scenario.train,
        thresholds=dataclasses.asdict(bars.train),
        error=outcome.error,
        wall_s=outcome.wall_s,
        **fields,
    )


def _line(record: Verification, width: int | None = None) -> str:
    """One status line per finished case, fitted to `width` columns as `bench run`'s are (bench.formats
    .fit_parts: a part, such as the power's phrase, is never split; continued lines indented)."""
    case_id = escape(record.case.case_id)
    wall = f"[dim]{record.wall_s:.1f} s[/]"
    if record.status != "ok":
        first = first_line(record.error)
        style = "red" if record.status == "failed" else "yellow"
        return fit_parts([f"[{style}]{record.status:<7}[/] {case_id}", escape(first)], width)
    if isinstance(record, LayerVerification):
        failures = [f for _, fs in record.failures() for f in fs]
        name, stats = max((c.worst_param for c in record.comparisons), key=lambda kv: kv[1].rel_l2)
        detail = f"worst param rel-L2 {stats.rel_l2:.1e} ({escape(name)})"
    else:
        failures = record.failures()
        loss = max(record.loss_rel, default=0.0)
        norm = max(record.grad_norm_rel, default=0.0)
        detail = f"max loss rel {loss:.1e}, grad-norm rel {norm:.1e}"
    if failures:
        more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
        return fit_parts([f"[bold red]FAIL[/]    {case_id}", f"{escape(failures[0])}{more}", wall], width)
    if record.no_power_against:
        return fit_parts([f"[bold yellow]pass[/], {escape(power_text(record))}: {case_id}", wall], width)
    return fit_parts([f"[green]pass[/]    {case_id}", detail, f"({escape(power_text(record))})", wall], width)


def exit_code(records: Sequence[Verification]) -> int:
    """EXIT_CHECK_FAILED if a check failed, else EXIT_NOT_RUN if a case failed to run, else EXIT_NO_POWER
    if a check passed a mutant, else 0 (skipped cases, under torchrun those of another cp, do not count, as
    in `bench run`)."""
    if any(r.status == "ok" and not r.passed for r in records):
        return EXIT_CHECK_FAILED
    if any(r.status == "failed" for r in records):
        return EXIT_NOT_RUN
    if any(r.no_power_against for r in records):
        return EXIT_NO_POWER
    return 0


def run(
    scenarios: Sequence[str] = (),
    *,
    sets: Sequence[str] = (),
    filters: Sequence[str] = (),
    seeds: int = 1,
    train: int | str | None = None,
    device: str | None = None,
    output: str | None = None,
    config: str | None = None,
    layer_hook: LayerHook | None = None,
    console: Console | None = None,
) -> int:
    """Verify the scenarios' cases and write the records; returns the exit code (see the module docstring).

    Args:
        scenarios: names in the suite's scenarios folder or .yaml paths (at least one)
        sets: `key=value` overrides of suite or scenario keys (e.g. `thresholds={rel_l2: 0.01}`)
        filters: --filter expressions (bench.suite.filters)
        seeds: seeds per case of the layer comparison: the scenario's seed and the next seeds - 1
        train: None: the layer comparison; else a trajectory of that many steps (TRAIN_FROM_SCENARIO: the
            scenario's train.steps)
        device: auto, cpu, cuda or npu; overrides the suite and the scenarios
        output: result file; default <results_dir>/<date>-<branch>-<commit>-verify-<scenarios>.json
        config: bench.yaml path; default ./bench.yaml
        layer_hook: TEST HOOK: a picklable function applied to every CP layer of the layer comparison
            (compare_layer_under_cp's layer_hook), to break a mode on purpose; never set by the CLI
    """
    _check_flags(scenarios, seeds, train)
    choice = CaseChoice(scenarios, sets, filters, device, config)
    session = Session.open(
        choice,
        console or default_console,
        lambda found: [dataclasses.replace(s, cases=verification_cases(s.cases)) for s in found],
    )
    selections, console = session.selections, session.console
    names = [s.scenario.name for s in selections]
    rank_fn, steps_by_scenario = _rank_fn(selections, seeds, train, layer_hook)
    launcher = session.launcher(rank_fn, timed=False)
    name = run_name(names, train=train is not None)
    extra = [*(["--seeds", str(seeds)] if seeds != 1 else []), *(["--output", output] if output else [])]
    if train is not None:
        extra[:0] = ["--train"] if train == TRAIN_FROM_SCENARIO else ["--train", str(train)]
    writer = session.result_writer(output, name, command=choice.argv(NAME, extra))
    # no oversubscription warning: verify times nothing, more ranks than cores only make it slower
    todo = [(sel.scenario, c) for sel in selections for c in sel.cases]
    try:
        records = _verify_all(todo, launcher, writer, console, seeds=seeds, steps=steps_by_scenario or None)
    except KeyboardInterrupt:
        if writer is not None:
            console.print(f"[yellow]interrupted[/]: finished cases are in {escape(display(writer.path))}")
        return 130
    console.print()
    print_tables(verification_tables(records), console)
    if writer is not None:
        print_path(console, "results", str(display(writer.path)))
    return exit_code(records)


def _check_flags(scenarios: Sequence[str], seeds: int, train: int | str | None) -> None:
    """UserError for flags that cannot work, before anything is loaded."""
    if not scenarios:
        raise UserError("name the scenario to verify, e.g. `bench verify cpu-verify` (see `bench list`)")
    if seeds < 1:
        raise UserError(f"--seeds {seeds}: give a positive number of seeds, e.g. --seeds 100")
    if train is not None and seeds != 1:
        raise UserError(
            "--seeds applies to the layer comparison; --train runs one trajectory per case from the "
            "scenario's seed (change it with --set seed=N)"
        )


def _rank_fn(
    selections: Sequence[Selection], seeds: int, train: int | str | None, layer_hook: LayerHook | None
) -> tuple[RankFn, dict[str, int]]:
    """What each rank runs (the layer comparison over the seeds, or a training trajectory), and with
    --train the steps per scenario (else empty)."""
    if train is None:
        seed_lists = {s.scenario.name: [s.scenario.seed + i for i in range(seeds)] for s in selections}
        return functools.partial(_layer_rank, seeds=seed_lists, layer_hook=layer_hook), {}
    trained = {s.scenario.name: _check_train(s, train) for s in selections}
    steps = {name: t[1] for name, t in trained.items()}
    settings = {name: t[0] for name, t in trained.items()}
    return functools.partial(_train_rank, settings=settings, steps=steps), steps


def _verify_all(
    todo: Sequence[tuple[Scenario, Case]],
    launcher: LocalLauncher | TorchrunLauncher,
    writer: ResultWriter | None,
    console: Console,
    *,
    seeds: int,
    steps: dict[str, int] | None,
) -> list[Verification]:
    """Launch every case in order under a progress bar; record and print each as it finishes."""
    records: list[Verification] = []
    n = len(todo)
    with launcher.group(), CaseProgress(console, n) as progress:
        for scenario, case in todo:
            progress.start(case.key())
            outcome = launcher.run(case)
            record = _record(
                case,
                scenario,
                outcome,
                seeds=[scenario.seed + i for i in range(seeds)],
                steps=None if steps is None else steps[scenario.name],
            )
            if writer is not None:
                writer.add_verification(record)
            records.append(record)
            # off a terminal each line starts with [i/N] (CaseProgress): the line fits beside it
            progress.done(_line(record, console.width - (0 if console.is_terminal else len(f"[{n}/{n}] "))))
    return records
