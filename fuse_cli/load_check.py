"""The first promise, kept with or without verification: fuse never writes a model onnxruntime
cannot load. Verification loads every candidate it judges; a model it did not judge `match` is
loaded here once before it is written. A pass whose rewrites make the model unloadable is dropped
(bisected like any other); where the model does not load even with every pass dropped while the
input does, no pass is to blame: fuse's own writing broke it, an internal error, and nothing is
written."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from fuse_cli.core import isolation, model_runs
from fuse_cli.core.sessions import source_of
from fuse_cli.errors import FuseError, InternalError
from fuse_cli.fusing import Fused
from fuse_cli.graph.io import read_original
from fuse_cli.pipeline.base import Pass
from fuse_cli.report.model import RolledBack
from fuse_cli.rollback import drop_breaking_passes


def load_problem(model) -> str | None:
    """None if onnxruntime builds a session of `model` (graph optimizations off: the model as
    written), else its one-line reason. In the worker process: a loader that crashes is a reason."""
    try:
        isolation.call(model_runs.load, source_of(model))
    except FuseError as exc:
        return str(exc)
    return None


def loadable(source: Path, fused: Fused, passes: Sequence[Pass], build: Callable[[list[Pass]], Fused]
             ) -> tuple[Fused, tuple[RolledBack, ...]]:
    """`fused` (built from `passes`), or the candidate without the passes that stop it loading,
    with a record of each pass dropped. Raises InternalError when nothing fuse can drop helps."""
    problem = load_problem(fused.model)
    if problem is None:
        return fused, ()
    bare_problem = load_problem(build([]).model) if passes else problem
    if bare_problem is not None:
        if load_problem(read_original(source)) is not None:
            return fused, ()  # the input does not load either: nothing of fuse's to keep
        raise InternalError(f"{source}: the output would not load in onnxruntime even with every pass left out "
                            f"({bare_problem}); nothing written. This is a bug in fuse: please report it")

    def judge(candidate: Fused, whole: str | None) -> tuple[bool, str | None]:
        reason = load_problem(candidate.model)
        return reason is None, reason
    kept = drop_breaking_passes(passes, fused, build, judge)
    return kept.candidate, tuple(RolledBack(p.name, None, None, reason) for p, reason in kept.dropped)
