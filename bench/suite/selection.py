"""From command-line words to cases: scenario names or paths, --set overrides and --filter, validated."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.errors import UserError
from bench.suite.config import Case, Scenario
from bench.suite.filters import CaseFilter
from bench.suite.loader import (
    ConfigError,
    Locator,
    Override,
    Suite,
    display,
    find_scenario,
    read_scenario,
)


@dataclass(frozen=True, slots=True)
class Selection:
    """One scenario of a command, and its cases that pass the filter."""

    path: Path
    scenario: Scenario
    locate: Locator
    """Where each key of the file is, for the checks before launch (bench.launch.preflight)."""
    cases: list[Case]
    """Expanded cases that match --filter, in expansion order."""
    total: int
    """Cases before the filter."""


def select(
    suite: Suite, names: Sequence[str], overrides: Sequence[Override], case_filter: CaseFilter
) -> list[Selection]:
    """Load each named scenario (the suite's default when none) with overrides, expand and filter it."""
    out = []
    given: dict[str, tuple[str, Path]] = {}
    for name in names or [suite.config.default_scenario]:
        path = find_scenario(suite, name)
        _refuse_same_name(given, name, path)
        scenario, locate = read_scenario(path, overrides)
        cases = scenario.cases(
            warmup=suite.config.warmup, repeat=suite.config.repeat, rounds=suite.config.rounds
        )
        out.append(
            Selection(
                path=path, scenario=scenario, locate=locate, cases=case_filter.apply(cases), total=len(cases)
            )
        )
    return out


def _refuse_same_name(given: dict[str, tuple[str, Path]], word: str, path: Path) -> None:
    """ConfigError when a scenario of the same name (its file's stem) was given before: its cases and its
    definition in the result file would replace the other's. `given`: name -> (word, path), updated."""
    before = given.get(path.stem)
    if before is None:
        given[path.stem] = (word, path)
        return
    if before[1].resolve() == path.resolve():
        raise ConfigError(f"scenario '{path.stem}': given twice (as {before[0]} and {word}); name it once")
    raise ConfigError(
        f"{display(before[1])} and {display(path)}: both are scenario '{path.stem}' (a scenario is named by "
        "its file), so one would replace the other's results; rename one of the files, or run them separately"
    )


def run_device(suite_device: str, selections: Sequence[Selection]) -> str:
    """The one device of the run: each scenario's own, else the suite's (--device has set both)."""
    devices = {s.scenario.name: s.scenario.device or suite_device for s in selections}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} ({d})" for name, d in devices.items())
        raise ConfigError(f"scenarios {listed} name different devices; run them separately, or pass --device")
    return next(iter(devices.values()))


def require_cases(
    selections: Sequence[Selection],
    filters: Sequence[str],
    *,
    flag: str = "--filter",
    narrowed_by: str | None = None,
) -> None:
    """UserError when no case is left in any of the selections: the one "no case left" message of every
    command that runs or compares cases. `flag`: the flag `filters` came from (profile's --case);
    `narrowed_by`: what else narrowed them (compare's "the result file's cases")."""
    if any(s.cases for s in selections):
        return
    names = [s.scenario.name for s in selections]
    total = sum(s.total for s in selections)
    by = [f"{flag} {f' {flag} '.join(filters)}"] if filters else []
    by += [narrowed_by] if narrowed_by else []
    raise UserError(
        f"{' and '.join(by) or 'the selection'} {'match' if len(by) > 1 else 'matches'} none of the {total} "
        f"cases of {', '.join(names)}; see `bench list {' '.join(names)}` for their ids and fields"
    )
