"""Read bench.yaml and scenario files (with `--set key=value` overrides) into configs, and check their cases.

Every mistake is one line naming where (file:line, or the --set that caused it), the key, the problem and
the fix, e.g. `scenarios/foo.yaml:7: mode: unknown mode 'ring'; use one of ulysses, p2p, all_gather, scan`.
All of it runs before any rank starts; each file is read once (the checks of its cases against the host,
bench.launch.preflight, use the Locator it returns).

`--set key=value` values are parsed as YAML (`--set repeat=3`, `--set cp=[1,2]`). A key of the suite
(bench.yaml) sets the suite; a key of the scenario sets the top level of every scenario in the run; warmup,
repeat, rounds and device are both. A sweep key (cp, seq_len, local_seq_len, mode, checkpoint, pass)
replaces that list in every sub-sweep too, so it holds for the whole run; setting seq_len or local_seq_len
replaces both.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.errors import FieldError, UserError, first_line, suggest
from bench.suite.config import LAYER_KEYS, Scenario, SuiteConfig, Sweep, TrainSettings
from bench.suite.fields import check_mapping, yaml_key, yaml_keys
from gdn_cp import GatedDeltaNetConfig

SUITE_FILE = "bench.yaml"
PACKAGE_DIR = Path(__file__).resolve().parent.parent
DEFAULTS_DIR = PACKAGE_DIR / "defaults"
"""bench's packaged defaults (package data): the suite file used from any folder without a bench.yaml and
written out by `bench init`, and the interconnect examples of `bench model`."""
PACKAGED_SUITE = DEFAULTS_DIR / SUITE_FILE
_WHEEL_SCENARIOS = PACKAGE_DIR / "scenarios"
PACKAGED_SCENARIOS = _WHEEL_SCENARIOS if _WHEEL_SCENARIOS.is_dir() else PACKAGE_DIR.parent / "scenarios"
"""The shipped scenarios, one copy: the repository's top-level scenarios/, which a wheel carries as
bench/scenarios (pyproject's force-include); from a checkout (an editable install, or PYTHONPATH=.) the
folder itself."""
INIT_FIX = (
    "write the packaged defaults (a bench.yaml and a scenarios/ folder) into a new folder with `bench init "
    "FOLDER`"
)

SUITE_KEYS = yaml_keys(SuiteConfig)
SWEEP_KEYS = yaml_keys(Sweep)
TRAIN_KEYS = yaml_keys(TrainSettings)
SCENARIO_KEYS = (
    {k: f for k, f in yaml_keys(Scenario).items() if k not in ("name", "sweep", "layer")}
    | SWEEP_KEYS
    | {k: k for k in LAYER_KEYS}
)
"""YAML keys of a scenario file: its own fields, the top-level sweep lists, `sweeps`, and the layer's."""
LENGTH_KEYS = ("seq_len", "local_seq_len")


class ConfigError(UserError):
    """A bench.yaml, scenario or --set mistake; the message is one line with file, key and fix."""


def display(path: Path) -> str:
    """`path` relative to the working directory when inside it (shorter messages)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------------------------------------
# --set


@dataclass(frozen=True, slots=True)
class Override:
    """One `--set key=value`."""

    key: str
    """The top-level key it sets (`train` of `--set train.vocab_size=512`)."""
    value: Any
    text: str
    """The flag as given, for messages: `--set cp=[1,2]`, `--device cpu`."""
    path: tuple[str, ...] = ()
    """The keys below `key` a dotted key sets inside a mapping (`("vocab_size",)`), the rest kept."""

    def apply(self, data: dict[str, Any]) -> None:
        """Set the value into `data` (a file's mapping): the whole key, or one key inside its mapping;
        ConfigError when what a dotted key reaches into is not a mapping."""
        if not self.path:
            data[self.key] = self.value
            return
        node = data
        for depth, key in enumerate((self.key, *self.path[:-1])):
            child = node.get(key)
            if child is None:
                child = {}
            if not isinstance(child, dict):
                reached = ".".join((self.key, *self.path)[: depth + 1])
                raise ConfigError(
                    f"{self.text}: {reached} is not a mapping here, so no key can be set inside it; set it "
                    f"whole, e.g. --set '{reached}={{...}}'"
                )
            node[key] = child = dict(child)  # a copy: the file's own mapping is never changed
            node = child
        node[self.path[-1]] = self.value


def parse_overrides(items: Iterable[str], device: str | None = None) -> list[Override]:
    """Parse `--set key=value` items (value as YAML), plus `--device` when given (the same as --set
    device=...); ConfigError for a malformed item or unknown key."""
    known = SUITE_KEYS.keys() | SCENARIO_KEYS.keys()
    out = []
    for item in items:
        dotted, sep, raw = item.partition("=")
        key, *path = dotted.strip().split(".")
        if not sep or not key or not all(path):
            raise ConfigError(f"--set {item}: expected key=value, e.g. --set repeat=3 or --set 'cp=[1, 2]'")
        if key not in known:
            raise ConfigError(f"--set {item}: unknown key '{key}'; {suggest(key, known)}")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or first_line(str(exc))
            raise ConfigError(
                f"--set {item}: {key}: the value is not valid YAML ({problem}); write it as in a scenario "
                "file, e.g. --set 'cp=[1, 2]'"
            ) from None
        out.append(Override(key=key, value=value, text=f"--set {item}", path=tuple(path)))
    if device is not None:
        out.append(Override(key="device", value=device, text=f"--device {device}"))
    return out


# ----------------------------------------------------------------------------------------------------------
# YAML with line numbers


MAX_DEPTH = 32
"""Deepest nesting of mappings and lists a suite or scenario file may have (a scenario needs 4)."""
MAX_BYTES = 1 << 20
"""Largest suite or scenario file read (a scenario is a few KB)."""


def _check_tree(node: yaml.Node | None, where: str) -> None:
    """ConfigError naming both lines when a mapping, at any depth, gives a key twice (YAML would keep the
    last one silently), or naming the line where the nesting passes MAX_DEPTH. Walked with a stack, not
    recursion, so that no depth of input can overflow it."""
    stack = [(node, 1)] if node is not None else []
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            continue
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"{where}:{node.start_mark.line + 1}: nested {depth} levels deep, more than the {MAX_DEPTH} "
                "a suite or scenario file may have; flatten it"
            )
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, depth + 1) for item in node.value)
            continue
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = str(key_node.value)
            if key in seen:
                raise ConfigError(
                    f"{where}:{line}: {key}: given twice (lines {seen[key]} and {line}); keep one of them"
                )
            seen[key] = line
            stack.append((value_node, depth + 1))


def _parse_yaml(text: str, where: str) -> tuple[Any, yaml.Node | None]:
    """The document in `text` and its node tree, parsed once (composed, checked by `_check_tree`, then
    constructed from the same nodes)."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # PyYAML composes recursively: nesting far past MAX_DEPTH overflows it
            raise ConfigError(
                f"{where}: nested far more than the {MAX_DEPTH} levels a suite or scenario file may have; "
                "flatten it"
            ) from None
        _check_tree(node, where)
        return (loader.construct_document(node) if node is not None else None), node
    finally:
        loader.dispose()


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple, int]]:
    """The mapping in `path`, and the 1-based line of each key.

    Line keys are paths: ("mode",), ("sweeps", 0), ("sweeps", 0, "cp"), and for a mapping value such as
    `train:` its keys: ("train", "lr").
    """
    where = display(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(
                f"{where}: {size / 2**20:.1f} MiB, more than the {MAX_BYTES >> 20} MiB a suite or scenario "
                "file may have (a scenario is a few KB); check the path"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror}); check the path") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{where}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8"
        ) from None
    try:
        data, node = _parse_yaml(text, where)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or first_line(str(exc))
        column = f" (column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{where}{line}: malformed YAML: {problem}{column}; fix the syntax there") from None
    if data is None:
        data, node = {}, None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: expected a mapping of keys (key: value lines), got {type(data).__name__}"
        )
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            lines[(key_node.value,)] = key_node.start_mark.line + 1
            if key_node.value == "sweeps" and isinstance(value_node, yaml.SequenceNode):
                for i, item in enumerate(value_node.value):
                    lines[("sweeps", i)] = item.start_mark.line + 1
                    if isinstance(item, yaml.MappingNode):
                        for k, _ in item.value:
                            lines[("sweeps", i, k.value)] = k.start_mark.line + 1
            elif isinstance(value_node, yaml.MappingNode):
                for k, _ in value_node.value:
                    lines[(key_node.value, k.value)] = k.start_mark.line + 1
    return data, lines


class Locator:
    """Formats "where" for a key: `file:line`, or `file (--set k=v)` when an override set the key."""

    def __init__(self, path: Path | None, lines: dict[tuple, int], overrides: Iterable[Override]) -> None:
        self.file = display(path) if path is not None else "bench.yaml (defaults)"
        self.lines = lines
        self.overrides = {o.key: o for o in overrides}

    def __call__(self, *keypath: Any) -> str:
        top = keypath[0] if keypath else None
        if top in self.overrides:
            return f"{self.file} ({self.overrides[top].text})"
        for n in range(len(keypath), 0, -1):
            if keypath[:n] in self.lines:
                return f"{self.file}:{self.lines[keypath[:n]]}"
        return self.file

    def error(self, keypath: tuple, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self(*keypath)}: {key}: {message}")


def _check_keys(
    data: dict, known: dict[str, str], locate: Locator, prefix: tuple = (), label: str = ""
) -> None:
    for key in data:
        if key not in known:
            k = str(key)
            raise locate.error((*prefix, key), f"{label}{k}", f"unknown key; {suggest(k, known)}")


def _build(cls: type, fields: dict[str, Any], locate: Locator, prefix: tuple = (), label: str = "") -> Any:
    """cls(**fields) with YAML keys mapped to field names; a FieldError becomes a located ConfigError."""
    names = yaml_keys(cls)
    try:
        check_mapping(cls, fields)  # a wrong type, before a class that does not check types sees it
        return cls(**{names[k]: v for k, v in fields.items()})
    except FieldError as exc:
        raise locate.error((*prefix, exc.key), f"{label}{exc.key}", exc.message) from None
    except ValueError as exc:  # a library config's check: "GatedDeltaNetConfig.hidden_size must be ..."
        field, _, problem = str(exc).removeprefix(f"{cls.__name__}.").partition(" ")
        if field not in names:
            raise
        raise locate.error((*prefix, field), f"{label}{field}", problem) from None
    except (
        TypeError
    ) as exc:  # a required field is missing: "... missing 1 required ... argument: 'hidden_size'"
        quoted = re.findall(r"'(\w+)'", str(exc))
        key = next((yaml_key(q) for q in quoted if q in {f.name for f in dataclasses.fields(cls)}), None)
        if key is None:
            raise
        raise locate.error(prefix, f"{label}{key}", f"required but missing; add {key}: <value>") from None


# ----------------------------------------------------------------------------------------------------------
# Suite


@dataclass(frozen=True, slots=True)
class Suite:
    """The suite config and the folder its relative paths are relative to."""

    config: SuiteConfig
    root: Path
    """The folder of bench.yaml (the working directory when there is none)."""
    path: Path | None
    """bench.yaml, or None when the defaults are used."""

    @property
    def scenarios_dir(self) -> Path:
        """The suite's scenarios folder; without a bench.yaml, ./scenarios when there is one, else the
        packaged scenarios (PACKAGED_SCENARIOS), so that `bench` works from any folder."""
        local = self.root / self.config.scenarios_dir
        if self.path is None and not local.is_dir():
            return PACKAGED_SCENARIOS
        return local

    @property
    def results_dir(self) -> Path:
        return self.root / self.config.results_dir

    @property
    def plots_dir(self) -> Path:
        return self.root / self.config.plots_dir


def load_suite(path: str | Path | None = None, overrides: Iterable[Override] = ()) -> Suite:
    """bench.yaml at `path`, else ./bench.yaml if present, else the packaged defaults (PACKAGED_SUITE, with
    its paths relative to the working directory: results go to ./results); --set suite keys applied."""
    overrides = [o for o in overrides if o.key in SUITE_KEYS]
    if path is None and Path(SUITE_FILE).is_file():
        path = SUITE_FILE
    if path is None:
        data = _read_yaml(PACKAGED_SUITE)[0] if PACKAGED_SUITE.is_file() else {}
        lines, root, file = {}, Path.cwd(), None
    else:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(
                f"{display(file)}: no such suite file; give the path of a bench.yaml (--config)"
            )
        data, lines = _read_yaml(file)
        root = file.resolve().parent
    locate = Locator(file, lines, overrides)
    _check_keys(data, SUITE_KEYS, locate)
    for o in overrides:
        o.apply(data)
    return Suite(config=_build(SuiteConfig, data, locate), root=root, path=file)


# ----------------------------------------------------------------------------------------------------------
# Scenarios


def scenario_names(suite: Suite) -> list[str]:
    return sorted(p.stem for p in suite.scenarios_dir.glob("*.yaml"))


def no_scenarios_error(suite: Suite) -> ConfigError | None:
    """The error for a suite whose scenarios folder is missing or holds no scenario file (naming where it
    looked and the fix), or None when it has scenarios."""
    folder = suite.scenarios_dir
    if scenario_names(suite):
        return None
    problem = "holds no scenario files (*.yaml)" if folder.is_dir() else "does not exist"
    if suite.path is None:  # the packaged scenarios are gone: a broken install
        return ConfigError(
            f"no scenarios: the packaged folder {folder} {problem}; reinstall bench (pip install -e . in its "
            "checkout), or give a scenario file's path"
        )
    return ConfigError(
        f"no scenarios: {display(folder)}, the scenarios_dir of {display(suite.path)}, {problem}; add "
        f"scenario files there or set scenarios_dir in {display(suite.path)}, or {INIT_FIX}"
    )


def find_scenario(suite: Suite, name_or_path: str) -> Path:
    """A scenario name (looked up in the suite's scenarios folder) or a path to a .yaml file."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigError(f"{name_or_path}: no such scenario file; give a .yaml path or a scenario name")
        return path
    path = suite.scenarios_dir / f"{name_or_path}.yaml"
    if not path.is_file():
        missing = no_scenarios_error(suite)
        if missing is not None:
            raise ConfigError(f"scenario '{name_or_path}': {missing}")
        hint = suggest(name_or_path, scenario_names(suite))
        raise ConfigError(f"scenario '{name_or_path}': no {display(path)}; {hint} (see `bench list`)")
    return path


def _apply_overrides(data: dict[str, Any], overrides: list[Override]) -> None:
    sweeps = data.get("sweeps") if isinstance(data.get("sweeps"), list) else []
    for o in overrides:
        replaced = LENGTH_KEYS if o.key in LENGTH_KEYS else (o.key,)
        if not o.path:  # a dotted key sets inside the mapping, keeping the rest
            for key in replaced:
                data.pop(key, None)
        o.apply(data)
        if o.key in SWEEP_KEYS:
            for entry in sweeps:
                if isinstance(entry, dict):
                    for key in replaced:
                        entry.pop(key, None)


def load_scenario(path: Path, overrides: Iterable[Override] = ()) -> Scenario:
    """A scenario file with the scenario keys of `overrides` applied, validated."""
    return read_scenario(path, overrides)[0]


def read_scenario(path: Path, overrides: Iterable[Override] = ()) -> tuple[Scenario, Locator]:
    """`load_scenario`, and the Locator of the file, so that later checks (bench.launch.preflight) name
    the file and line of a key without reading the file again."""
    overrides = [o for o in overrides if o.key in SCENARIO_KEYS]
    data, lines = _read_yaml(path)
    locate = Locator(path, lines, overrides)
    if "name" in data:
        raise locate.error(
            ("name",),
            "name",
            f"a scenario is named by its file ({path.stem}); remove this key or rename the file",
        )
    _check_keys(data, SCENARIO_KEYS, locate)
    _apply_overrides(data, overrides)
    raw_sweeps = data.pop("sweeps", None) or []
    if not isinstance(raw_sweeps, list):
        raise locate.error(
            ("sweeps",), "sweeps", "expected a list of mappings such as - {cp: [2], seq_len: [4096]}"
        )
    sweeps = []
    for i, entry in enumerate(raw_sweeps):
        label = f"sweeps[{i}]."
        if not isinstance(entry, dict):
            raise locate.error(
                ("sweeps", i), f"sweeps[{i}]", "expected a mapping of sweep lists (cp: [...], ...)"
            )
        _check_keys(entry, SWEEP_KEYS, locate, ("sweeps", i), label)
        sweeps.append(_build(Sweep, entry, locate, ("sweeps", i), label))
    top = _build(Sweep, {k: data.pop(k) for k in list(data) if k in SWEEP_KEYS}, locate)
    layer = _build(GatedDeltaNetConfig, {k: data.pop(k) for k in list(data) if k in LAYER_KEYS}, locate)
    train = data.get("train")
    if isinstance(train, dict):
        _check_keys(train, TRAIN_KEYS, locate, ("train",), "train.")
        data["train"] = _build(TrainSettings, train, locate, ("train",), "train.")
    fields = {**data, "name": path.stem, "layer": layer, "sweep": top, "sweeps": sweeps}
    return _build(Scenario, fields, locate), locate
