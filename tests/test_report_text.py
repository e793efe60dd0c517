"""report/text.py: a model's names are data in each renderer."""

import xml.etree.ElementTree as ElementTree

from rich.console import Console

from fuse_cli.report.text import markdown, plain, terminal, visible, xml


def test_control_characters_are_shown_as_escapes():
    assert visible("a\nb\x1b[31m\x00\u202e") == "a\\nb\\x1b[31m\\x00\\u202e"
    assert visible("plain_name.onnx/über") == "plain_name.onnx/über"


def test_rich_prints_markup_as_text():
    console = Console(record=True, width=200)
    console.print(terminal("[/]") + " [bold]x[/bold] " + terminal("[link=file:///etc/passwd]y[/link]"))
    console.print(plain("[/][red]z"))
    assert console.export_text() == "[/] x [link=file:///etc/passwd]y[/link]\n[/][red]z\n"


def test_markdown_cannot_start_a_line_or_a_tag():
    text = markdown("a\n## Verified | <img src=x> `code` *b*")
    assert "\n" not in text and "<img" not in text
    assert text == "a\\\\n\\#\\# Verified \\| &lt;img src=x> \\`code\\` \\*b\\*"


def test_xml_text_parses():
    name = "nul\x00<&>\"'\x1b"
    assert ElementTree.fromstring(f'<t a="{xml(name)}">{xml(name)}</t>').text == visible(name)
