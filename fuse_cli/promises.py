"""fuse's two promises about what it writes, kept by dropping the passes that break them:
the outputs are the original's (verification), and the estimated peak activation memory is not
above the original's (the peak guard). rollback.py finds the pass; this module judges."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from fuse_cli.audit import PeakEstimate
from fuse_cli.config import FuseConfig
from fuse_cli.core import isolation
from fuse_cli.core.tensors import weight_bytes
from fuse_cli.fusing import Fused
from fuse_cli.graph.io import LoadedModel, read_original
from fuse_cli.pipeline.base import ModelPass, Pass
from fuse_cli.pipeline.records import NearMiss
from fuse_cli.progress import carried, step, update
from fuse_cli.report.model import PeakDecline, PeakGrowth, RolledBack
from fuse_cli.report.render import human_bytes
from fuse_cli.rollback import drop_breaking_passes
from fuse_cli.verify import MISMATCH, VerifyResult, compare_with_reference, reference_plan


def keep_promises(source: Path, loaded: LoadedModel, passes: list[Pass], fuse, estimate: PeakEstimate,
                  config: FuseConfig):
    """The pipeline less the passes that break fuse's promises: the outputs are the original's
    (verification; a candidate that fails where the original runs breaks it too) and the
    estimated peak is not above the original's (the peak guard, unless --allow-peak-growth).
    Each broken promise drops passes by bisection (rollback.py); a pass dropped for one promise
    changes the candidate the other judged, so the two alternate until neither drops one."""
    concurrent = config.verify and weight_bytes(loaded.model) <= CONCURRENT_WEIGHT_LIMIT
    with ThreadPoolExecutor(1) as worker:
        pending = _reference(source, loaded, config, worker if concurrent else None)

        def peak_judge(candidate: Fused, whole: tuple[PeakGrowth, ...] | None):
            # in the bisection, only the settings where the whole candidate grew: a prefix that
            # grows elsewhere is lowered there again by a later pass
            with step("peak guard"):
                growth = () if config.allow_peak_growth else estimate.growth(
                    candidate.model, at=None if whole is None else [g.dims for g in whole])
            return not growth, growth

        def verify_judge(candidate: Fused, whole: VerifyResult | None):
            # From memory: the candidate's big weights are references to files (the input's, or the
            # lot's for new ones), which onnxruntime maps; nothing is written until one is kept.
            with step("verification"):
                update("waiting for the original's runs")  # while they go on beside the pipeline
                reference = pending.result()
                update("")
                result = compare_with_reference(reference, candidate.model, config.rtol, config.atol,
                                                concurrent=concurrent)
            return result.status != MISMATCH, result

        active, fused = list(passes), fuse(passes)
        verification, rolled_back, declined = None, [], []
        while True:
            guarded = drop_breaking_passes(active, fused, fuse, peak_judge, trailing=lambda p: isinstance(p, ModelPass))
            declined += [PeakDecline(p.name, getattr(p, "label", p.name), growth) for p, growth in guarded.dropped]
            if pending is None or (verification is not None and not guarded.dropped):
                return guarded.candidate, verification, tuple(rolled_back), tuple(declined)
            checked = drop_breaking_passes(guarded.active, guarded.candidate, fuse, verify_judge)
            rolled_back += [_rolled_back(p.name, result) for p, result in checked.dropped]
            active, fused, verification = checked.active, checked.candidate, checked.evidence
            if not checked.dropped:
                return fused, verification, tuple(rolled_back), tuple(declined)


# Verification's runs of the original (an onnxruntime session per shape setting: on a 12k-node
# graph most of what verification adds) go on beside the pipeline, on a worker thread, where the
# model's weights are at most this: onnxruntime releases the GIL while it builds and runs a
# session, so on two cores they cost no time. A candidate's sessions are built at once too. Above
# it everything goes one at a time, as issue 18's memory budget needs: the original's session
# gone before the pipeline starts, never two sessions alive at once.
CONCURRENT_WEIGHT_LIMIT = 64 * 2**20


def _reference(source: Path, loaded: LoadedModel, config: FuseConfig,
               worker: ThreadPoolExecutor | None) -> Future | None:
    """The original's reference outputs (None without verification): the original as its file
    has it (initializers that are inputs included), weights by reference; computed on `worker`
    when given, else now. What the runs need from the loaded graph is read here, before the
    pipeline rewrites anything."""
    if not config.verify:
        return None
    with step("verification"):
        isolation.start()  # onnxruntime runs in the worker process: its start-up overlaps what follows
        plan = reference_plan(loaded.model, config.dims, int_ranges=config.int_ranges)
        if worker is None:
            done: Future = Future()
            done.set_result(plan.run(read_original(source)))
            return done
    # resolved here: shape inference on the main thread works in a scratch folder for a
    # moment (analysis/shapes.py), and a relative path read then would be looked up there
    resolved = Path(source).resolve()

    def beside_the_pipeline():
        with step("verification"):
            return plan.run(read_original(resolved))
    return worker.submit(carried(beside_the_pipeline))


def _rolled_back(pass_name: str, result: VerifyResult) -> RolledBack:
    if not result.failing():  # the candidate did not run: nothing to compare
        return RolledBack(pass_name, None, None, result.reason)
    worst = max(result.failing(), key=lambda o: o.max_abs_diff)
    return RolledBack(pass_name, worst.name, worst.max_abs_diff, worst.problem)


def declined_near_miss(decline: PeakDecline) -> NearMiss:
    worst = max(decline.growth, key=lambda g: g.after_bytes - g.before_bytes)
    dims = ", ".join(f"{k}={v}" for k, v in worst.dims) or "the model's static shapes"
    alive = ", ".join(repr(name) for name in worst.alive)
    return NearMiss(decline.pass_name, decline.pattern, (), (
        f"raises the estimated peak activation memory by {human_bytes(worst.after_bytes - worst.before_bytes)} "
        f"({human_bytes(worst.before_bytes)} -> {human_bytes(worst.after_bytes)}) at {dims}: the new peak is at "
        f"{worst.peak_node}, where {alive} are alive (the guard lets {human_bytes(worst.tolerance_bytes)} pass there: "
        f"max(0.5% of the original's peak, 4 KiB)); pass --allow-peak-growth to keep it"))

