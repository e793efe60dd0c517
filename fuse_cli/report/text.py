"""Names from a model, made safe for each renderer. A model's node, tensor and file names are
data, never markup: rich reads `[/]` as a closing tag (MarkupError) and `[link=...]` as a
hyperlink, a terminal obeys escape sequences, a newline starts a new Markdown line (a fake
heading), and XML 1.0 forbids most control characters even as references (the SVG would not
parse). Every renderer passes what it did not write itself through one of these."""

from __future__ import annotations

import html
import re
import unicodedata

from rich.markup import escape as rich_escape
from rich.text import Text

# Bidirectional overrides reorder what a terminal or browser shows (a name can hide its tail).
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~#!])")


def visible(text: object) -> str:
    """`text` with each control character (newline, escape, NUL, bidi overrides, ...) written as
    a Python escape (`\\n`, `\\x1b`): one line, nothing a terminal or parser acts on."""
    text = str(text)
    if text.isprintable() and not _BIDI.intersection(text):
        return text  # the common case: nothing to replace
    return "".join(_shown(c) for c in text)


def _shown(c: str) -> str:
    if c in _BIDI or unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp"):
        return c.encode("unicode_escape", "backslashreplace").decode("ascii")
    return c


def terminal(text: object) -> str:
    """For a string rich will parse as markup (a table cell beside our own markup, a title)."""
    return rich_escape(visible(text))


def plain(text: object) -> Text:
    """For a rich cell or line that is data only: never parsed as markup."""
    return Text(visible(text))


def markdown(text: object) -> str:
    """Inline Markdown (GitHub flavour, which also renders HTML): markup characters escaped, and
    `<`, which would open an HTML tag (a `>` inside a line is text)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", visible(text)).replace("<", "&lt;")


def xml(text: object) -> str:
    """HTML and SVG text and attribute values."""
    return html.escape(visible(text), quote=True)


# Torch exports name a computed dim by its arithmetic (`floor(height/2 - 1/2) + 1`); nested through
# a network's strides and pools such a name reaches 1,500 characters, printed as one line.
DIM_SHOWN = 40
_CALL = re.compile(r"\b(?:floor|ceil|Floor|Ceil|Max|Min|Mod|max|min|mod)\(")
_OPERATOR = re.compile(r"\s*(?:[-+*%]|//?)\s*")
_OPERAND = re.compile(r"\d+(?:\.\d+)?|[A-Za-z_][\w.]*(?![\w(])")
_NOT_SYMBOLS = frozenset({"floor", "ceil", "Floor", "Ceil", "Max", "Min", "Mod", "max", "min", "mod"})


def short_dim(name: str) -> str:
    """A dim's name as a reader can take it in: whole when short, else its start, an ellipsis,
    its length and the symbols it is computed from."""
    if len(name) <= DIM_SHOWN:
        return name
    symbols = dict.fromkeys(w for w in re.findall(r"[A-Za-z_][\w.]*", name) if w not in _NOT_SYMBOLS)
    return (f"{name[:DIM_SHOWN].rstrip()}… (a {len(name):,}-character expression"
            f"{' of ' + ', '.join(symbols) if symbols else ''})")


def short_dims_in(text: str) -> str:
    """`text` with each long dim expression in it (one that calls floor, ceil, ...) shortened
    by `short_dim`: notes and reasons quote dims inside sentences."""
    out, done = [], 0
    for match in _CALL.finditer(text):
        if match.start() < done:
            continue  # inside an expression already taken
        end = _expression_end(text, match.start())
        if end is None or "…" in text[match.start():end]:
            continue  # a call left open is no dim; an ellipsis marks one shortened already
        out += [text[done:match.start()], short_dim(text[match.start():end])]
        done = end
    return "".join(out) + text[done:]


def _expression_end(text: str, start: int) -> int | None:
    """Where the expression that starts with a call at `start` ends: after the call's closing
    parenthesis and any `+ 1`, `/ 2` or further calls that follow; None where the call's
    parenthesis never closes."""
    depth, i = 0, text.index("(", start)
    while depth or i == text.index("(", start):
        if i == len(text):
            return None
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    while op := _OPERATOR.match(text, i):
        if _CALL.match(text, op.end()):
            end = _expression_end(text, op.end())
            if end is None:
                break
            i = end
        elif operand := _OPERAND.match(text, op.end()):
            i = operand.end()
        else:
            break
    return i
