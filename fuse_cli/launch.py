"""The `fuse` command's entry point: a line on a terminal while the libraries load.

Importing the command line takes 2-3 s (onnx, onnx-graphsurgeon, onnxruntime, numpy, rich), and
the live status line (report/status_line.py) can only start after it. So a run that will show one
says what it is doing from its first moment, on the same terminal, and erases it before the
command's own output. Standard library only: it prints before anything heavy is imported.
"""

from __future__ import annotations

import sys

LOADING = "fuse: starting (loading onnx and onnxruntime)"
# the commands that show a live status line on a terminal (optimize, report), and the flag that stops it
WATCHED = frozenset({"optimize", "report"})
QUIET = frozenset({"-q", "--quiet"})
ERASE_LINE = "\r\x1b[2K"


def shows_loading(argv: list[str], stderr=None) -> bool:
    """Whether this command line gets the loading line: a watched command, not quiet, stderr a terminal."""
    stderr = stderr or sys.stderr
    return (bool(argv) and argv[0] in WATCHED and not QUIET & set(argv)
            and hasattr(stderr, "isatty") and stderr.isatty())


def main() -> None:
    shown = shows_loading(sys.argv[1:])
    if shown:
        sys.stderr.write(LOADING)
        sys.stderr.flush()
    try:
        from fuse_cli.cli import main as command_line
    finally:
        if shown:
            sys.stderr.write(ERASE_LINE)
            sys.stderr.flush()
    command_line()


if __name__ == "__main__":
    main()
