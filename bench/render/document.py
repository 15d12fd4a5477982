"""A small document model (sections of paragraphs, tables, charts and folded blocks) and its markdown and
HTML renderers.

Report sections are built once, as data, and rendered twice: markdown (a README, a PR comment; charts as
links to PNG files; a folded block as <details>, which GitHub renders folded) and HTML (one self-contained
file: charts embedded as base64 PNG data URIs, the stylesheet inline, no other file and no network needed).
Text is plain text: the renderers escape it.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from bench.render.tables import TableData

if TYPE_CHECKING:  # bench.render.charts imports matplotlib: only load it when a chart is drawn
    from bench.render.charts.chart import Chart

Align = Literal["left", "right"]


@dataclass(kw_only=True, slots=True)
class Paragraph:
    text: str
    """Plain text; `code` spans in backticks are kept as code in both formats."""
    small: bool = False
    """A note under a table (rendered smaller in HTML, in italics in markdown)."""


@dataclass(kw_only=True, slots=True)
class Table:
    columns: list[str]
    rows: list[list[str]]
    align: list[Align] | None = None
    """Per column; default: the first column left, the others right (numbers)."""
    title: str | None = None
    """A caption above the table."""

    def alignment(self) -> list[Align]:
        return self.align or ["left"] + ["right"] * (len(self.columns) - 1)


@dataclass(kw_only=True, slots=True)
class Image:
    chart: Chart
    caption: str = ""


@dataclass(kw_only=True, slots=True)
class Links:
    """A list of links to other pages of a site (relative paths)."""

    items: list[tuple[str, str]]
    """(text, href)."""


@dataclass(kw_only=True, slots=True)
class Folded:
    """Blocks folded under a one-line summary that says what they hold and why (HTML's <details>, which
    markdown on GitHub renders too): the long tables a reader opens only when the line asks for it."""

    summary: str
    """Plain text, shown whether folded or not."""
    blocks: list[Block]


Block = Paragraph | Table | Image | Links | Folded


@dataclass(kw_only=True, slots=True)
class Section:
    """A titled part of a document."""

    title: str
    blocks: list[Block] = field(default_factory=list)
    subsections: list[Section] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------------
# Markdown


_LONE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def markdown_text(text: str) -> str:
    """Escape what markdown would take as markup (emphasis, strikethrough, table pipes, HTML), leaving
    `code` spans alone. An underscore inside a word (all_gather) is not emphasis and stays as it is."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        part = parts[i]
        for ch in ("\\", "*", "|", "<", "~"):
            part = part.replace(ch, "\\" + ch)
        parts[i] = _LONE_UNDERSCORE.sub(r"\\_", part)
    return "`".join(parts)


def markdown_table(table: Table) -> str:
    """A GitHub-flavoured markdown table (cells escaped)."""
    rule = {"left": ":---", "right": "---:"}
    lines = []
    if table.title:
        lines += [f"**{markdown_text(table.title)}**", ""]
    lines.append("| " + " | ".join(markdown_text(c) for c in table.columns) + " |")
    lines.append("| " + " | ".join(rule[a] for a in table.alignment()) + " |")
    for row in table.rows:
        lines.append("| " + " | ".join(markdown_text(c) for c in row) + " |")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class MarkdownCharts:
    """Where the markdown renderer puts chart files and how it links them."""

    folder: Path
    """Charts are saved here (PNG and SVG)."""
    relative_to: Path
    """Links are relative to this folder (the report's)."""


def _md_block(block: Block, charts: MarkdownCharts | None) -> str:
    if isinstance(block, Paragraph):
        return f"*{markdown_text(block.text)}*" if block.small else markdown_text(block.text)
    if isinstance(block, Table):
        return markdown_table(block)
    if isinstance(block, Links):
        return "\n".join(f"- [{markdown_text(text)}]({href})" for text, href in block.items)
    if isinstance(block, Folded):
        # the element GitHub renders folded; the blank lines keep the markdown inside it markdown
        inner = "\n\n".join(_md_block(b, charts) for b in block.blocks)
        return f"<details><summary>{_html_text(block.summary)}</summary>\n\n{inner}\n\n</details>"
    if charts is None:
        raise ValueError(f"chart {block.chart.name} in a markdown document without a chart folder")
    png, _svg = block.chart.save(charts.folder)
    link = Path(os.path.relpath(png, charts.relative_to)).as_posix()
    alt = block.chart.title.replace("]", ")").replace("[", "(")
    caption = f"\n\n*{markdown_text(block.caption)}*" if block.caption else ""
    return f"![{alt}]({link}){caption}"


def _md_section(section: Section, level: int, charts: MarkdownCharts | None) -> list[str]:
    out = [f"{'#' * level} {markdown_text(section.title)}"]
    out += [_md_block(b, charts) for b in section.blocks]
    for sub in section.subsections:
        out += _md_section(sub, level + 1, charts)
    return out


def render_markdown(title: str, sections: Sequence[Section], charts: MarkdownCharts | None) -> str:
    """The document as GitHub-flavoured markdown; charts are saved under `charts` and linked (None: the
    sections must hold no chart)."""
    parts = [f"# {markdown_text(title)}"]
    for section in sections:
        parts += _md_section(section, 2, charts)
    return "\n\n".join(parts) + "\n"


# ----------------------------------------------------------------------------------------------------------
# HTML


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #ddd; padding-bottom: .3em; }
h2 { border-bottom: 1px solid #eee; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 14px; }
caption { text-align: left; font-weight: 600; padding-bottom: .3em; }
th, td { border: 1px solid #ddd; padding: 4px 10px; }
th { background: #f6f8fa; }
td.right, th.right { text-align: right; font-variant-numeric: tabular-nums; }
p.small { font-size: 12px; color: #666; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 12px; color: #666; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; }
details { margin: .6em 0 1.2em; }
summary { cursor: pointer; }
"""


def _html_text(text: str) -> str:
    parts = [html.escape(p) for p in text.split("`")]
    for i in range(1, len(parts), 2):
        parts[i] = f"<code>{parts[i]}</code>"
    return "".join(parts) if len(parts) % 2 else html.escape(text)


def html_table(table: Table) -> str:
    align = table.alignment()
    rows = [f"<table>{f'<caption>{_html_text(table.title)}</caption>' if table.title else ''}", "<tr>"]
    rows[-1] += "".join(
        f'<th class="{a}">{_html_text(c)}</th>' for c, a in zip(table.columns, align, strict=True)
    )
    rows[-1] += "</tr>"
    for row in table.rows:
        cells = "".join(f'<td class="{a}">{_html_text(c)}</td>' for c, a in zip(row, align, strict=True))
        rows.append(f"<tr>{cells}</tr>")
    rows.append("</table>")
    return "\n".join(rows)


def _html_block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return (
            f'<p class="small">{_html_text(block.text)}</p>'
            if block.small
            else f"<p>{_html_text(block.text)}</p>"
        )
    if isinstance(block, Table):
        return html_table(block)
    if isinstance(block, Links):
        items = "".join(
            f'<li><a href="{html.escape(href, quote=True)}">{_html_text(text)}</a></li>'
            for text, href in block.items
        )
        return f"<ul>{items}</ul>"
    if isinstance(block, Folded):
        inner = "\n".join(_html_block(b) for b in block.blocks)
        return f"<details><summary>{_html_text(block.summary)}</summary>\n{inner}\n</details>"
    data = base64.b64encode(block.chart.png_bytes()).decode("ascii")
    caption = f"<figcaption>{_html_text(block.caption)}</figcaption>" if block.caption else ""
    alt = html.escape(block.chart.title, quote=True)
    return f'<figure><img alt="{alt}" src="data:image/png;base64,{data}">{caption}</figure>'


def _html_section(section: Section, level: int) -> list[str]:
    out = [f"<h{level}>{_html_text(section.title)}</h{level}>"]
    out += [_html_block(b) for b in section.blocks]
    for sub in section.subsections:
        out += _html_section(sub, min(level + 1, 6))
    return out


def render_html(title: str, sections: Sequence[Section]) -> str:
    """One self-contained HTML page."""
    body = [f"<h1>{_html_text(title)}</h1>"]
    for section in sections:
        body += _html_section(section, 2)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def document_blocks(tables: Sequence[TableData]) -> list[Block]:
    """The tables as report blocks (bench.render.document renders them to markdown and HTML), notes under
    each."""
    blocks: list[Block] = []
    for t in tables:
        align: list[Align] = ["right" if i in t.numeric else "left" for i in range(len(t.headers))]
        blocks.append(Table(title=t.title, columns=t.headers, rows=t.rows, align=align))
        blocks += [Paragraph(text=note, small=True) for note in t.notes]
    return blocks
