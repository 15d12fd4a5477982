"""bench from Python: run a scenario and get its results, as records or as a pandas DataFrame.

    from bench import api
    run = api.run("cpu-smoke", sets={"repeat": 3}, filters=["mode=p2p"])  # a RunResult; its file is written
    df = api.dataframe(run)  # one row per case (needs pandas)

`run` is `bench run` (bench.commands.run.execute, the command's own code path): the same suite and scenario
lookup, checks, launches and result file, with the command line it stands for recorded in the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console

from bench.commands import run as run_command
from bench.errors import UserError
from bench.launch.local import check_main_guarded
from bench.results.export import export_rows
from bench.results.store import RunResult

if TYPE_CHECKING:  # pandas is optional: dataframe imports it when called
    import pandas

PANDAS_MISSING = (
    "bench.api.dataframe needs pandas, which bench does not install; `pip install pandas`, or use "
    "bench.results.export.export_rows(run) for the same rows as plain dicts"
)


def set_items(sets: Mapping[str, Any] | Sequence[str] | str) -> list[str]:
    """`--set` items from a mapping (values written as JSON, which is YAML: {"cp": [1, 2]} -> "cp=[1, 2]"),
    from `key=value` strings as given, or from one such string."""
    if isinstance(sets, Mapping):
        return [f"{key}={json.dumps(value)}" for key, value in sets.items()]
    if isinstance(sets, str):
        return [sets]
    if not all(isinstance(item, str) for item in sets):
        raise UserError(
            f"bench.api.run(sets=...): expected a mapping or key=value strings, got {sets!r}; e.g. "
            'sets={"repeat": 3} or sets=["repeat=3"]'
        )
    return list(sets)


def run(
    scenarios: str | Sequence[str] = (),
    *,
    sets: Mapping[str, Any] | Sequence[str] | str = (),
    filters: Sequence[str] | str = (),
    device: str | None = None,
    output: str | None = None,
    resume: str | None = None,
    config: str | None = None,
    quiet: bool = False,
) -> RunResult:
    """Run scenarios as `bench run` does and return the run (its result file is written as usual: `output`,
    else runs/ of the suite's folder). A mistake (an unknown scenario, key or value) raises
    bench.errors.UserError with the message the command would print; cases that fail are in the result
    with status "failed"; Ctrl-C raises KeyboardInterrupt once the finished cases are saved.

    Args:
        scenarios: a scenario name or .yaml path, or several; none: the suite's default_scenario
        sets: overrides of suite or scenario keys, {"repeat": 3}, ["repeat=3"] or "repeat=3"
        filters: --filter expressions, e.g. ["mode=p2p,cp=2"]
        device: auto, cpu, cuda or npu
        output: result file (must not exist); resume: an earlier result file to continue
        config: bench.yaml path; default ./bench.yaml, else the packaged defaults
        quiet: print nothing (no progress, no tables)
    """
    try:
        check_main_guarded()
    except RuntimeError as exc:
        raise UserError(f"bench.api.run: {exc}") from None
    names = [scenarios] if isinstance(scenarios, str) else list(scenarios)
    outcome = run_command.execute(
        names,
        sets=set_items(sets),
        filters=[filters] if isinstance(filters, str) else list(filters),
        device=device,
        output=output,
        resume=resume,
        config=config,
        console=Console(quiet=True) if quiet else None,
    )
    if outcome.exit_code == 130:
        raise KeyboardInterrupt
    return outcome.run


def dataframe(run: RunResult, *, per_sample: bool = False) -> pandas.DataFrame:
    """The run's rows (bench.results.export: one per case, or per sample with `per_sample`, and one per
    verify record) as a pandas DataFrame; ImportError with what to do when pandas is not installed."""
    try:
        import pandas
    except ImportError:
        raise ImportError(PANDAS_MISSING) from None
    return pandas.DataFrame(export_rows(run, per_sample=per_sample))
