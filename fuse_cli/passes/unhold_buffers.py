"""Declared dims that keep onnxruntime's allocation planner from holding a dead buffer across the peak."""

from __future__ import annotations

import onnx

from fuse_cli.pipeline.base import Estimates, ModelPass, lower_without_growth, peak_change
from fuse_cli.pipeline.records import FusionRecord
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.declared_dims import declare_fresh_dims, undeclare

DROPPED_LABEL = "declared shapes -> dropped"
# Declarations tried per model: each is judged by a walk of the memory model at every shape setting.
# Held tensors with nothing to declare (every dim a value) cost no walk and do not count.
MAX_TRIES = 8


@register
class UnholdBuffers(ModelPass):
    """onnxruntime's planner hands a dead buffer to a later tensor of the same planner shape (its
    dims, named or valued, as its inference left them), and with the arena off that buffer stays
    allocated from its first tenant's birth to its last tenant's death (analysis/memory.py). Where
    that stretch spans the peak with no tenant alive, the peak holds a buffer nobody uses:

        x ─ Conv ─ a ─ Conv ─ b ──────────────────── Concat ─ Conv ─ c ─ Conv ─ d
                  (a dies)      ... the peak ...                        (d takes a's buffer:
                                                                         a's bytes held all along)

    U-Nets do it across their bottleneck: a skip connection's neighbour is freed on the way down
    and its buffer waits for the same-shaped tensor on the way up (unet-small at batch 8: 176.1
    MiB estimated and measured; 151.6 with the declaration below, as onnx-simplifier's output has, whose
    exported dims onnxruntime cannot name).

    The later tensor's shape is declared (value_info) with a fresh name for each of its symbolic
    dims, `unheld_N`: onnxruntime's inference keeps a declared name and carries it downstream, so
    that tensor matches no buffer freed before and the dead one is released where it dies (onnx-simplifier's
    exports get it by accident: their value_info names such dims unk__N). Nothing is added to the
    graph, so nothing stands between the nodes onnxruntime fuses at its default level (a
    Reshape(x, Shape(x)) view did the same for the planner, and broke the U-Net's NCHWc Conv chain
    there: 1.025 against the original at `all`, this form 0.988). Each declaration is judged by the
    peak guard's own estimate, as the node order is: kept only when never worse at any setting
    under any execution rule and lower by more than the estimate's noise (scheduling.peak_tolerance)
    at the bound dims or at the guard's larger setting. The larger setting is where the gains are
    in a default run, whose unbound dims are 1: a prefill at batch 64 holds the MLP's buffers
    through the next layer's attention, at batch 1 it does not (the declaration is what lets the
    guard keep a fusion there); the held-out BERT-small dynamo export, declared at batch 64,
    measured 3.41 -> 2.65 MiB at batch 1 x 128, and ran 0.86 of the original's CPU time at
    onnxruntime's default level where the undeclared output ran 0.99. Where naming the
    first later tenant gains nothing, every later tenant of the buffer is named at once: a decoder
    frees a layer's attention buffer into a chain of same-shaped tensors of the layers after it,
    and naming one only passes the buffer to the next (the held-out Llama export at opset 23, at
    the guard's batch 64: 59.8 -> 55.6 MiB against the original's 56.5, so its rotary embeddings
    and attention fuse). Then the next held buffer, up to MAX_TRIES walks. Runs after every fusion,
    before `schedule`.

    Before any of that, the model without the shapes its exporter declared (value_info, hints
    onnxruntime does not need): torch's dynamo exporter declares every intermediate, and those
    names make the planner pass a layer's dead buffers to the next layer's tensors, held across
    the peak; undeclared, the dims its inference cannot name (behind a Reshape to a shape read at
    run time) match no freed buffer. The held-out T5 encoder measured 4.2 -> 2.7 MiB at batch 1 x
    128 (onnxslim's output, which rewrites the declarations, 3.7; without them 2.3), Qwen2 4.5 ->
    2.3. Elsewhere the declarations are what keeps buffers apart (DenseNet: 8.4 -> 10.1 MiB
    without them; the declarations this pass writes), so they go only where the estimate says so,
    by the rule the declarations are judged by.
    """

    name = "unhold-buffers"
    description = "Keep onnxruntime's planner from holding a dead buffer across the peak (fresh declared dims)"
    label = "held buffer -> fresh declared dims"

    def run(self, model: onnx.ModelProto, estimates: Estimates) -> tuple[FusionRecord, ...]:
        if estimates.held is None or estimates.planner is None:
            return ()
        records: list[FusionRecord] = []
        try:
            current = estimates.peaks_by_rule(model)
        except ValueError:  # a stored order that is not topological (the memory model's check): as it is
            return ()
        if model.graph.value_info:
            declared = list(model.graph.value_info)
            del model.graph.value_info[:]
            after = estimates.peaks_by_rule(model)
            if lower_without_growth(current, after):
                records.append(self._record(DROPPED_LABEL, current, after))
                current = after
            else:
                model.graph.value_info.extend(declared)
        tried: set[str] = set()
        walks = 0
        while walks < MAX_TRIES:
            buffer = next((b for b in estimates.held(model) if b.name not in tried), None)
            if buffer is None:
                break
            tried.add(buffer.name)
            # the first later tenant, then (where the freed buffer would only pass to the next
            # tensor of that shape: a layer's twin in the next layer) every later tenant
            for tenants in dict.fromkeys((buffer.tenants[:1], buffer.tenants)):
                declared = [d for name in tenants if (d := declare_fresh_dims(model, name, estimates.planner(model)))]
                if not declared:
                    continue  # nothing to name (a shape vector): no walk spent on it
                walks += 1
                try:
                    after = estimates.peaks_by_rule(model)
                except ValueError:
                    after = None
                if after is not None and lower_without_growth(current, after):
                    records.append(self._record(self.label, current, after))
                    current = after
                    break
                for d in reversed(declared):
                    undeclare(model, d)
                if walks >= MAX_TRIES:
                    break
        return tuple(records)


    def _record(self, label: str, before: dict[str, tuple[int, ...]],
                after: dict[str, tuple[int, ...]]) -> FusionRecord:
        """A kept change, with its part of the peak change at the bound dims in onnxruntime's order."""
        return FusionRecord(self.name, label, (), (), (), peak_delta=peak_change(before, after))
