"""What the engine reports: the rewrites it made and the matches a check declined. The report
model (fuse_cli/report/model.py) re-exports these; the engine never imports the report."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RemovedTensor:
    """An intermediate a fusion made disappear. `nbytes` is at the bound shapes, with unbound
    symbolic dims taken as 1 (listed in Report.unbound_dims); None when a dim is truly unknown."""

    name: str
    nbytes: int | None


@dataclass(frozen=True)
class FusionRecord:
    """One rewrite: which pass, which nodes it replaced, what it put there, what vanished."""

    pass_name: str
    pattern: str
    replaced: tuple[str, ...]
    created: tuple[str, ...]
    removed: tuple[RemovedTensor, ...]

    @property
    def nodes_removed(self) -> int:
        return len(self.replaced) - len(self.created)


@dataclass(frozen=True)
class NearMiss:
    """A structural match that a precondition rejected, with the reason in plain words."""

    pass_name: str
    pattern: str
    nodes: tuple[str, ...]
    reason: str
