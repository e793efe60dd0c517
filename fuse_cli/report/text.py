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
