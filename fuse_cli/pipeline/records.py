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
    # A model pass's own estimate of its part of the peak change (bytes, at the bound dims); None
    # for the graph passes, whose part the audit derives from the tensors they removed.
    peak_delta: int | None = None

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


@dataclass(frozen=True)
class OrderRecord:
    """What the node-order pass did. Peaks are estimated bytes per execution rule ("onnxruntime":
    the order onnxruntime's walk makes of the stored order; "stored": as stored), one per shape
    setting the peak guard judges (the bound dims first). `unscheduled` is the input order's
    onnxruntime execution as indices into the written nodes, and `input_order` its stored order
    (both empty when the order was kept), so the report can show and measure the model without
    the pass."""

    pass_name: str
    pattern: str
    rules: tuple[str, ...]
    peaks_before: tuple[tuple[int, ...], ...]  # per rule, in `rules` order
    peaks_after: tuple[tuple[int, ...], ...]
    lower_bound: int        # no order's peak is below this at the bound dims
    method: str             # "kept", or the candidate that won ("liu", "dp", "dp-beam", "local")
    exact: bool             # the winner is the dynamic program's optimum (see scheduling/program.py)
    reason: str             # why the order was kept
    seconds: float
    unscheduled: tuple[int, ...] = ()
    input_order: tuple[int, ...] = ()

    @property
    def changed(self) -> bool:
        return self.method != "kept"
