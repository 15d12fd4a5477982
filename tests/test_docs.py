"""The documentation matches the code: the generated pages are current, every path and module a page names
exists, every page is linked from the README, and the README stays short."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from functools import cache
from pathlib import Path

import pytest

from gdn_cp.ops.backends.plugins import ENTRY_POINT_GROUP

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 200

PATH_PREFIXES = ("bench", "gdn_cp", "scripts", "scenarios", "docs", "tests", "results", "plots", ".ci")
PATH = re.compile(
    r"(?<![\w/.\-~$])((?:" + "|".join(re.escape(p) for p in PATH_PREFIXES) + r")/[\w./<>*{}\\\-]*)"
)
MODULE = re.compile(r"(?<![\w/.\-])((?:bench|gdn_cp)(?:\.[A-Za-z_]\w*)+)(?!\w|\.?<)")
"""A dotted name of the project (`bench.judge.comparison`, `gdn_cp.ops.register_backend`); one followed by a
placeholder (`gdn_cp.wait.<kind>`, a profiler range's name) is not a module."""
FILE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".md", ".txt", ".toml", ".sh", ".png", ".svg", ".csv")
PLACEHOLDERS = ("<", "*", "...", "{", "\\")
OUTPUT_DIR = "results/"
"""Where commands write: a folder under it (results/history, results/profiles) is made by a run, not
committed; a file under it (one with a suffix) must exist."""
KNOWN_ABSENT = {
    "bench/scenarios": "the wheel's copy of scenarios/ (pyproject's force-include), absent from a checkout",
}
NOT_MODULES = {
    ENTRY_POINT_GROUP: "the entry point group of backend plugins (gdn_cp.ops.backends.plugins), not a module",
}
"""Dotted names of the project's vocabulary that name no module."""
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _load_generator():
    spec = importlib.util.spec_from_file_location("_docs_generator", ROOT / "scripts" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prose(text: str) -> str:
    """The page without its fenced code blocks, whose example commands name files of the reader's own."""
    return FENCE.sub("", text)


def test_generated_pages_are_current() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in _load_generator().pages().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"{', '.join(stale)} out of date with the code: run python scripts/docs.py"


def test_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move reference into docs/ (under 200)"


def test_every_page_is_linked_from_the_readme() -> None:
    targets = {(ROOT / t.split("#")[0]).resolve() for t in LINK.findall(README.read_text(encoding="utf-8"))}
    missing = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in targets]
    assert not missing, f"README.md links none of {missing}: add them to its map of docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file) if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert not broken, f"{page.name} links to files or headings that do not exist: {broken}"


@cache
def _anchors(page: Path) -> frozenset[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces to -."""
    headings = re.findall(r"^#+ (.+)$", _prose(page.read_text(encoding="utf-8")), re.MULTILINE)
    return frozenset(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings)


def _named_paths(text: str) -> set[str]:
    out = set()
    for token in PATH.findall(_prose(text)):
        token = token.rstrip(".,:;")
        if any(p in token for p in PLACEHOLDERS):
            continue
        token = token.rstrip("/")
        if token.startswith(OUTPUT_DIR) and not token.endswith(FILE_SUFFIXES):
            continue
        out.add(token)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(page: Path) -> None:
    missing = sorted(
        p
        for p in _named_paths(page.read_text(encoding="utf-8"))
        if p not in KNOWN_ABSENT and not (ROOT / p).exists()
    )
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@cache
def _module_file(name: str) -> Path | None:
    """The source of module `name` in this checkout, or None."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


@cache
def _top_level_names(path: Path) -> frozenset[str] | None:
    """The names a module binds at its top level (defs, classes, assignments, imports); None when it has a
    module __getattr__ (anything may resolve)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return None if "__getattr__" in names else frozenset(names)


def _resolves(dotted: str) -> bool:
    """Whether `dotted` is a module of this checkout, or one followed by attributes it has. The longest
    prefix that is a module file is the module; its first attribute is looked up in its source (no import),
    then, only when the source does not bind it, by importing it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = _module_file(".".join(parts[:i]))
        if path is None:
            continue
        rest = parts[i:]
        if not rest:
            return True
        names = _top_level_names(path)
        if names is None or rest[0] in names:
            return True
        try:  # bound dynamically (a loop, globals()): ask the module itself
            obj = importlib.import_module(".".join(parts[:i]))
            getattr(obj, rest[0])
        except (ImportError, AttributeError):
            return False
        return True
    return False


def _named_modules(text: str) -> set[str]:
    out = set()
    for token in MODULE.findall(text):
        if token.endswith(FILE_SUFFIXES) or token.lower().endswith(FILE_SUFFIXES):
            continue  # bench.yaml: a file
        if token in NOT_MODULES:
            continue
        out.add(token)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_modules_exist(page: Path) -> None:
    missing = sorted(m for m in _named_modules(page.read_text(encoding="utf-8")) if not _resolves(m))
    assert not missing, f"{page.name} names modules or attributes that do not exist: {missing}"


def _quoted_calls() -> dict[str, object]:
    """The public callables whose keyword arguments a page may quote, by the name the pages call them."""
    from gdn_cp import CPOptions, GatedDeltaNetConfig, LinearAttentionContextParallel
    from gdn_cp.accuracy import compare_layer_under_cp, compare_prefill_under_cp
    from gdn_cp.distributed import cp_chunk_gated_delta_rule
    from gdn_cp.models import apply_context_parallel
    from gdn_cp.models.qwen35_transformers import apply_context_parallel_to_qwen35
    from gdn_cp.ops import chunk_gated_delta_rule, recurrent_gated_delta_rule, register_backend

    return {
        f.__name__: f
        for f in (
            CPOptions,
            GatedDeltaNetConfig,
            LinearAttentionContextParallel,
            apply_context_parallel,
            apply_context_parallel_to_qwen35,
            chunk_gated_delta_rule,
            compare_layer_under_cp,
            compare_prefill_under_cp,
            cp_chunk_gated_delta_rule,
            recurrent_gated_delta_rule,
            register_backend,
        )
    }


QUOTED_CALL = re.compile(r"\b([A-Za-z_]\w*)\(([^()`]*)\)")
KEYWORD = re.compile(r"(?:^|,)\s*([A-Za-z_]\w*)\s*=")


def _takes(callable_: object, keyword: str) -> bool:
    """Whether `callable_` takes `keyword`: a parameter of that name, or one of the CP options its **fields
    stand for (CPOptions.build)."""
    from gdn_cp.distributed.modes import OPTION_FIELDS

    target = callable_.__init__ if isinstance(callable_, type) else callable_
    parameters = inspect.signature(target).parameters
    if keyword in parameters:
        return True
    kwargs = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    return bool(kwargs) and kwargs[0].name == "fields" and keyword in OPTION_FIELDS


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_quoted_keyword_arguments_are_taken(page: Path) -> None:
    """Issue 44: docs/library.md documented a `backend=` the functions did not take. Every call of a public
    gdn_cp function a page quotes (in code or prose, `name(..., key=...)`) names only keywords it takes."""
    calls = _quoted_calls()
    wrong = [
        f"{name}({keyword}=)"
        for name, arguments in QUOTED_CALL.findall(page.read_text(encoding="utf-8"))
        if name in calls
        for keyword in KEYWORD.findall(arguments)
        if not _takes(calls[name], keyword)
    ]
    assert not wrong, f"{page.name} quotes keywords the code does not take: {', '.join(sorted(set(wrong)))}"


ARCHITECTURE = ROOT / "docs" / "architecture.md"
FLOW_NAME = re.compile(r"(?<![\w/.])([a-z_]+(?:\.[A-Za-z_]\w*)+)(?![\w(])")
FLOW_FILE = re.compile(r"(?<![\w./])((?:[a-z_]+/)*[a-z_]+\.py)\b")


def _flow_blocks() -> str:
    """The code blocks of the architecture page's two flow sections."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    sections = re.findall(r"^## (?:Data|Code) flow.*?(?=^## )", text, flags=re.MULTILINE | re.DOTALL)
    return "\n".join(line for section in sections for line in section.splitlines() if line.startswith("    "))


def _resolves(name: str) -> bool:
    """Whether a dotted name of a flow step is a module, or an attribute of one, of bench or gdn_cp, given
    from inside a package (`measure.rank.measure_on_rank`, `modes.mode_class`, `ops.ran`)."""
    parts = name.split(".")
    for root in ("", "bench", "gdn_cp", "gdn_cp.distributed", "gdn_cp.ops"):
        for cut in range(len(parts), 0, -1):
            try:
                target = importlib.import_module(".".join([root, *parts[:cut]]).lstrip("."))
            except ImportError:
                continue
            try:
                for attribute in parts[cut:]:
                    target = getattr(target, attribute)
            except AttributeError:
                break
            return True
    return False


def test_the_flows_name_modules_that_exist() -> None:
    """Issue 47: the architecture page walks one case and one layer call through the modules; every module,
    attribute and file a step names exists."""
    blocks = _flow_blocks()
    assert "measure.rank" in blocks and "modes/sequence_shard.py" in blocks
    names = {n for n in FLOW_NAME.findall(blocks) if not n.endswith(".py")}
    missing = [n for n in sorted(names) if not _resolves(n)]
    sources = [
        p.relative_to(ROOT).as_posix()
        for package in ("bench", "gdn_cp")
        for p in (ROOT / package).rglob("*.py")
    ]
    files = {f for f in FLOW_FILE.findall(blocks) if not any(s.endswith("/" + f) for s in sources)}
    assert not missing and not files, (
        f"docs/architecture.md's flows name what does not exist: {missing, files}"
    )
