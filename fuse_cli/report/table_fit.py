"""Tables that fit the console's width, planned before rich lays them out.

rich narrows a table that is too wide by shrinking its wrappable columns and then, as a last
resort, every column evenly, down to zero: a label column vanishes and figures stand under the
wrong headers (a Llama export's savings table at 80 columns lost its Pattern and Count columns
and its Rest and Total labels). Here every column gets a width that rich keeps as given: a figure
never narrower than itself, a label never narrower than a readable strip, the widest narrowed
first. Where even those minimums do not fit, each row is printed as a block of `header value`
pairs instead (`stacked`), which fits any width.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

# A wrapped label narrower than this is read a syllable at a time.
LABEL_FLOOR = 10
# Borders and padding: one rule per column plus the closing one, one space on each side of a cell.
_RULE, _PADDING = 1, 2
# Where a figure's line may break: before a note in parentheses ("1.6 KiB (+2 of unknown size)"),
# after a note ending in a colon ("left out: +1.0 KiB") and before the second half of a pair
# ("1.23 / 1.45", "1.4 KiB -> 1.2 KiB"); never inside "1.6 KiB". A note's words may wrap apart.
_NOTE_BREAK = re.compile(r" (?=\()|(?<=:) ")
_PAIR_BREAK = re.compile(r" (?=/ |-> )")


@dataclass(frozen=True)
class Column:
    header: str
    figure: bool = False  # right-aligned; its figures stay whole (a note in parentheses may wrap)
    whole: bool = False   # a name to copy (a pass name): never broken, left-aligned
    weight: int = 1       # how much width the column keeps, against the others, when the table must narrow
    min_width: int | None = None  # a text column's floor (default LABEL_FLOOR); never above its widest line


Cell = Text | str  # a str is rich markup (the caller escaped what it did not write)


def fitted_table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, *, title: str | None = None,
                 styles: Sequence[str | None] | None = None,
                 sections: Sequence[bool] | None = None) -> RenderableType:
    """A table of `rows` at most `width` cells wide, or its rows stacked where no table fits.
    `styles`: a style per row (None: plain); `sections`: whether a rule follows each row."""
    texts = [[cell if isinstance(cell, Text) else Text.from_markup(cell) for cell in row] for row in rows]
    widths = plan_widths(columns, texts, width)
    if widths is None:
        return stacked(columns, texts, title=title, styles=styles)
    texts = [[_wrapped_figure(cell, w) if c.figure else cell for cell, c, w in zip(row, columns, widths)]
             for row in texts]
    table = Table()
    for column, w in zip(columns, widths):
        table.add_column(column.header, width=w, justify="right" if column.figure else "left",
                         overflow="fold", no_wrap=column.whole)
    for i, row in enumerate(texts):
        table.add_row(*row, style=styles[i] if styles else None, end_section=bool(sections and sections[i]))
    # the title on a line of its own: rich wraps a table's title at the table's width, not the console's
    return Group(Text.from_markup(title), table) if title else table


def plan_widths(columns: Sequence[Column], rows: Sequence[Sequence[Text]], width: int) -> list[int] | None:
    """Each column's content width, the table at most `width` wide; None where the columns'
    minimums do not fit. Narrowing goes in steps, each only as far as needed, the widest (by
    width over weight) first: figures wrap their headers, then their notes, then text columns
    wrap down to their floor, then figures break their pairs ("12.35 /" over "13.46")."""
    available = width - _RULE * (len(columns) + 1) - _PADDING * len(columns)
    cells = [[row[i].plain for row in rows] for i in range(len(columns))]
    natural = [max([_widest_line(c.header)] + [_widest_line(cell) for cell in cells[i]]) for i, c in enumerate(columns)]
    minimum = [min(natural[i], _minimum(c, cells[i], split_pairs=True)) for i, c in enumerate(columns)]
    whole_figures = [min(natural[i], _minimum(c, cells[i], split_pairs=False)) for i, c in enumerate(columns)]
    whole_values = [max([whole_figures[i]] + [_widest_line(cell) for cell in cells[i]]) for i in range(len(columns))]
    if sum(natural) <= available:
        return natural
    if sum(minimum) > available:
        return None
    widths = list(natural)
    figures, texts = [c.figure for c in columns], [not (c.figure or c.whole) for c in columns]
    for narrowing, floor in ((figures, whole_values), (figures, whole_figures), (texts, minimum), (figures, minimum)):
        if sum(widths) <= available:
            break
        fitting = [n for n in range(max(natural) + 1)
                   if sum(_narrowed(widths, floor, columns, narrowing, n)) <= available]
        widths = _narrowed(widths, floor, columns, narrowing, max(fitting, default=0))  # 0: all at their floor
    # cells a level left over: text first (it was cut before the figures broke their pairs), most cut first
    for i in sorted(range(len(columns)), key=lambda i: (not texts[i], widths[i] - natural[i])):
        widths[i] += max(0, min(available - sum(widths), natural[i] - widths[i]))
    return widths


def _narrowed(widths: list[int], floor: list[int], columns: Sequence[Column], narrowing: list[bool],
              level: int) -> list[int]:
    return [max(lo, min(w, level * c.weight)) if narrow else w
            for w, lo, c, narrow in zip(widths, floor, columns, narrowing)]


def _minimum(column: Column, cells: list[str], *, split_pairs: bool) -> int:
    """The narrowest the column may be: a figure as wide as its widest figure (unless
    `split_pairs`, a pair such as "12.35 / 13.46" on one line) and header word, a name as wide
    as itself, text at its floor."""
    words = max((cell_len(w) for w in column.header.split()), default=0)  # a header may wrap between words
    if column.whole:
        return max([words] + [_widest_line(cell) for cell in cells])
    if column.figure:
        return max([words] + [_figure_width(line, split_pairs) for cell in cells for line in cell.splitlines()])
    return LABEL_FLOOR if column.min_width is None else column.min_width


def _figure_width(line: str, split_pairs: bool) -> int:
    """The narrowest a figure's line may wrap to: its widest figure, or the widest word of a note."""
    bounds = [-1, *_breaks(line, split_pairs), len(line)]
    return max(cell_len(line[a + 1:b]) for a, b in zip(bounds, bounds[1:]))


def _breaks(line: str, split_pairs: bool) -> list[int]:
    """The spaces where a figure's line may break."""
    found, start = [], 0
    for piece in _NOTE_BREAK.split(line):
        end = start + len(piece)
        if piece.startswith("(") or piece.endswith(":"):
            found += [start + m.start() for m in re.finditer(" ", piece)]
        elif split_pairs:
            found += [start + m.start() for m in _PAIR_BREAK.finditer(piece)]
        found += [end] if end < len(line) else []
        start = end + 1
    return found


def _wrapped_figure(cell: Text, width: int) -> Text:
    """`cell` broken into lines at most `width` wide at its breaks only: rich would break
    "204.0 KiB -> 204.0 KiB" between a figure and its unit."""
    lines = []
    for line in cell.split("\n"):
        start, fit = 0, None
        for end in [*_breaks(line.plain, split_pairs=True), len(line.plain)]:
            if fit is not None and cell_len(line.plain[start:end]) > width:
                lines.append(line[start:fit])
                start = fit + 1
            fit = end
        lines.append(line[start:])
    return Text("\n").join(lines)


def _widest_line(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def stacked(columns: Sequence[Column], rows: Sequence[Sequence[Text]], *, title: str | None = None,
            styles: Sequence[str | None] | None = None) -> RenderableType:
    """Each row as its first cell on a line of its own, then `header value` pairs, indented."""
    parts: list[RenderableType] = [Text.from_markup(title)] if title else []
    for i, row in enumerate(rows):
        style = (styles[i] if styles else None) or ""
        parts.append(Text.assemble(row[0], style=style) if row[0].plain else Text(columns[0].header, style=style))
        pairs = [Text.assemble((f"{c.header} ", "dim"), Text(" ").join(cell.split("\n")))
                 for c, cell in zip(columns[1:], row[1:]) if cell.plain]
        if pairs:
            parts.append(Padding(Text("; ").join(pairs), (0, 0, 0, 2)))
    return Group(*parts)
