"""The one line that says which fusions wait for an opset upgrade, and which `--upgrade-opset N`
unlocks them: the first thing a user of an old export should read."""

from __future__ import annotations

import re
from collections import Counter

from fuse_cli.report.model import Report

# The engine's opset decline (fuse_cli/pipeline/engine.py::_opset_decline) ends with this hint.
_UPGRADE = re.compile(r"pass --upgrade-opset (\d+)\b")


def upgrade_hint_lines(report: Report) -> list[str]:
    """[] when no near-miss waits for a newer opset; else one line: how many, of which patterns,
    and the smallest opset that unlocks them all (a higher one unlocks the lower ones too)."""
    waiting = [(m.pattern, int(found.group(1))) for m in report.near_misses if (found := _UPGRADE.search(m.reason))]
    if not waiting:
        return []
    needed = max(opset for _, opset in waiting)
    counts = Counter(pattern for pattern, _ in waiting)
    kinds = ", ".join(f"{count} x {pattern}" for pattern, count in counts.most_common())
    them = "it" if len(waiting) == 1 else f"all {len(waiting)}"
    return [f"{len(waiting)} fusion(s) wait for a newer opset ({kinds}): --upgrade-opset {needed} unlocks {them}"]
