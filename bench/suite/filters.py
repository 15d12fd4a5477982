"""`--filter EXPR`: choose cases by their fields.

Syntax: comma-separated terms, all of which must match (AND); `--filter` given several times keeps the
cases that match any of them (OR). A term is
    field=pattern    a case field, with shell-style wildcards: mode=p2p, cp=2, seq_len=4*, pass=forward
    pattern          a wildcard on the case id: *cp4*, p2p-ckpt-*-fwd_bwd
Fields: case_id, scenario, mode, checkpoint (true, false, or none for ulysses), overlap (true, false), cp,
seq_len, local_seq_len, pass, dtype, batch, layout, backend, documents (the case id's tag, e.g.
docs64-lognormal, or none).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.errors import UserError, suggest
from bench.suite.config import Case
from bench.suite.documents import documents_tag
from bench.suite.fields import yaml_keys

FILTER_FIELDS = (
    "case_id",
    "scenario",
    "mode",
    "checkpoint",
    "overlap",
    "cp",
    "seq_len",
    "local_seq_len",
    "pass",
    "dtype",
    "batch",
    "layout",
    "backend",
    "documents",
)


CASE_FIELDS = yaml_keys(Case)
"""A filter's field name -> the Case attribute (`pass` -> `pass_`); derived ones (dtype) are spelled alike."""


def _field_text(case: Case, name: str) -> str:
    if name == "documents":
        return documents_tag(case.documents)
    value = getattr(case, CASE_FIELDS.get(name, name))
    if isinstance(value, bool) or value is None:
        return str(value).lower()  # true, false, none: as YAML spells them
    return str(value)


@dataclass(frozen=True, slots=True)
class CaseFilter:
    """Parsed --filter expressions: a list of alternatives, each a list of (field, pattern) terms."""

    alternatives: tuple[tuple[tuple[str, str], ...], ...]

    def matches(self, case: Case) -> bool:
        if not self.alternatives:
            return True
        return any(
            all(fnmatch.fnmatchcase(_field_text(case, f), p) for f, p in terms) for terms in self.alternatives
        )

    def apply(self, cases: Iterable[Case]) -> list[Case]:
        return [c for c in cases if self.matches(c)]


def parse_filters(exprs: Sequence[str] | None) -> CaseFilter:
    """Parse --filter expressions (see the module docstring); UserError for an unknown field or empty term."""
    alternatives = []
    for expr in exprs or ():
        terms = []
        for term in expr.split(","):
            term = term.strip()
            field, sep, pattern = term.partition("=")
            if not sep:
                field, pattern = "case_id", term
            field, pattern = field.strip(), pattern.strip()
            if not pattern:
                raise UserError(
                    f"--filter {expr}: empty term; write field=value terms separated by commas, "
                    "e.g. mode=p2p,cp=2"
                )
            if field not in FILTER_FIELDS:
                raise UserError(f"--filter {expr}: unknown field '{field}'; {suggest(field, FILTER_FIELDS)}")
            terms.append((field, pattern))
        alternatives.append(tuple(terms))
    return CaseFilter(tuple(alternatives))
