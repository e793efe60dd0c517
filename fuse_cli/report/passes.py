"""Renderers of `fuse passes`: the pipeline for a target, the capability table, one pass explained,
and the whole as a Markdown reference (docs/passes.md)."""

from __future__ import annotations

import inspect
import re

from rich.console import Console
from rich.text import Text

from fuse_cli.passes import REGISTRY, pipeline_for
from fuse_cli.pipeline.base import Pass
from fuse_cli.report.table_fit import Column, fitted_table
from fuse_cli.targets import (CAPABILITY_HEADERS, PROVIDER_NAMES, PROVIDERS_OF, SLOWER, TARGETS, capability_rows)

# Pass and operator names stay whole (to copy into --passes / --disable); a description squeezed
# under 30 cells is read a word a line, so narrower terminals get each pass as a block of lines.
PASS_COLUMNS = (Column("Pass", whole=True), Column("Default", figure=True), Column("Min opset", figure=True),
                Column("Targets"), Column("Description", weight=3, min_width=30))
CAPABILITY_COLUMNS = (Column(CAPABILITY_HEADERS[0], whole=True),
                      *(Column(h) for h in CAPABILITY_HEADERS[1:-1]), Column(CAPABILITY_HEADERS[-1], weight=3))


def render_explanation(chosen: Pass, console: Console) -> None:
    console.print(f"[bold]{chosen.name}[/bold]: {chosen.description}\n", highlight=False)
    console.print(chosen.explanation, highlight=False, markup=False)
    for requirement in getattr(chosen, "requires", ()):
        console.print(f"\nOnly where: {requirement.says}", highlight=False, markup=False)


def render_passes(target: str, console: Console) -> None:
    default = pipeline_for(target)
    rows = [(Text(name), Text("*" if name in default else ""), Text(str(REGISTRY[name].required_opset(target))),
             Text(", ".join(sorted(REGISTRY[name].targets))), Text(REGISTRY[name].description))
            for name in list(default) + sorted(set(REGISTRY) - set(default))]
    console.print(fitted_table(PASS_COLUMNS, rows, console.width,
                               title=f"Passes (target {target}; * = in the default pipeline, in run order)"))
    if target != "onnx":
        console.print(fitted_table(CAPABILITY_COLUMNS, [tuple(map(Text, row)) for row in capability_rows(target)],
                                   console.width,
                                   title=f"onnxruntime fused operators and where they run (target {target})"))


# The Markdown reference (docs/passes.md is `fuse passes --markdown`): every pass's docstring, the
# pipelines it is in and the target tables, generated so the documentation cannot drift from the code.
REGENERATE = "fuse passes --markdown docs/passes.md"
_KINDS = {"PatternPass": "pattern", "GraphPass": "whole graph",
          "ModelPass": "exported model, judged by the memory model"}


def render_passes_markdown(target: str | None = None) -> str:
    """The passes reference: every target's pipeline (None), or one target's in run order."""
    targets = TARGETS if target is None else (target,)
    names = _merged_order(targets)
    title = "# Passes" if target is None else f"# Passes for `--target {target}`"
    lines = [title, "",
             f"<!-- Generated from the pass docstrings by `{REGENERATE}`: edit the passes, not this file. -->",
             "", _INTRO, "", "## Pipelines", ""]
    lines += _table(("pass", *(f"`{t}`" for t in targets), "min opset", "emits", "description"),
                    [(f"[`{n}`](#{n})", *(_position(n, t) for t in targets), _opset(REGISTRY[n], targets),
                      ", ".join(REGISTRY[n].emits), REGISTRY[n].description) for n in names])
    if target is None:
        lines += ["", "A number is the pass's place in that target's pipeline; `-`: not in it."]
    else:
        left_out = sorted(set(REGISTRY) - set(names))
        lines += ["", "Not in this target's pipeline: " + ", ".join(f"`{n}`" for n in left_out) + "."]
    if target != "onnx":
        lines += ["", "## onnxruntime fused operators and where they run", "", *_capabilities(target),
                  "", _FLOAT16_ON_CPU]
        lines += ["", "## Kernels measured slower than what they replace", "", *_slower(targets)]
    lines += ["", "## The passes"]
    for name in names:
        lines += ["", *_section(REGISTRY[name], targets)]
    return "\n".join(lines) + "\n"


_FLOAT16_ON_CPU = (
    "float16 on the CPU provider: a float16 node of an operator with only a float32 CPU kernel runs between Casts "
    "to float32 that onnxruntime inserts, as the float16 MatMul, Add and Softmax it would replace do (the CPU "
    "has no float16 kernel for them either). So the onnxruntime targets emit such an operator at float16 where "
    "every node it replaces that rounds ran in float32 there (a Clip or Max the CPU runs in float16 is exact), "
    "and decline it where one ran in float16; the peak guard's estimate counts the float32 copies. Gelu, "
    "FastGelu and QuickGelu differ: at float16 the CPU inlines their function body, the nodes they would "
    "replace, so `ort-cpu` writes the Casts to float32 and back around them itself and their float32 kernel "
    "runs (not `ort`, where CUDA would then compute in float32 too). On `ort-cpu`, write-cpu-casts then "
    "stores every Cast the provider would insert, weights' Casts first.")
_INTRO = ("Passes run in an explicit order per target (`fuse_cli/pipeline/registry.py`) and repeat until "
          "nothing changes; the graph is cleaned up and sorted once at the end, then the model passes run once. "
          "`--passes a,b` runs only those, `--disable c` skips one (an unknown name is an error with a \"did you "
          "mean\"), and `fuse passes --explain NAME` prints one pass's section.")


def _merged_order(targets: tuple[str, ...]) -> list[str]:
    """The passes of these targets' pipelines in one order that keeps each pipeline's: a pass one
    pipeline lacks goes right after its predecessor in the pipeline that has it."""
    order: list[str] = []
    for target in targets:
        previous = None
        for name in pipeline_for(target):
            if name not in order:
                order.insert(order.index(previous) + 1 if previous else 0, name)
            previous = name
    return order


def _position(name: str, target: str) -> str:
    pipeline = pipeline_for(target)
    return str(pipeline.index(name) + 1) if name in pipeline else "-"


def _opset(p: Pass, targets: tuple[str, ...]) -> str:
    opsets = {t: p.required_opset(t) for t in targets}
    portable = opsets.get("onnx", p.min_opset)
    runtime = {v for t, v in opsets.items() if t != "onnx"}
    if runtime and runtime != {portable}:
        return f"{portable} (onnxruntime targets: {', '.join(map(str, sorted(runtime)))})"
    return str(next(iter(set(opsets.values()))))


def _capabilities(target: str | None) -> list[str]:
    # the "usable" column says what one target may emit: without a target, the providers' columns say it all
    usable = CAPABILITY_HEADERS.index("usable")
    rows = capability_rows(target or "ort")
    if target is None:
        return _table(CAPABILITY_HEADERS[:usable] + CAPABILITY_HEADERS[usable + 1:],
                      [row[:usable] + row[usable + 1:] for row in rows])
    return _table(CAPABILITY_HEADERS, rows)


def _slower(targets: tuple[str, ...]) -> list[str]:
    providers = {p for t in targets for p in PROVIDERS_OF[t]}
    rows = [(s.op.replace(":", " with "), PROVIDER_NAMES[s.provider],
             "not in the pipelines of targets that run on it" if s.leaves_pipeline
             else "declined (a near-miss says why)",
             s.evidence) for s in SLOWER if s.provider in providers]
    return _table(("operator", "provider", "what fuse does", "measured"), rows)


def _section(p: Pass, targets: tuple[str, ...]) -> list[str]:
    facts = [f"{_KINDS.get(_kind(p), 'pass')} pass",
             "targets " + ", ".join(f"`{t}`" for t in TARGETS if t in p.targets),
             f"min opset {_opset(p, targets)}"]
    if p.emits:
        facts.append("emits " + ", ".join(f"`{op}`" for op in p.emits))
    doc = inspect.cleandoc(p.explanation)
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", doc)), default=0))
    facts_line = "; ".join(facts)
    only_where = [f"Only where: {r.says}" for r in getattr(p, "requires", ())]
    return [f"### {p.name}", "", f"{p.description}.", "", facts_line[0].upper() + facts_line[1:] + ".", "",
            *(line for said in only_where for line in (said, "")), f"{fence}text", doc, fence]


def _kind(p: Pass) -> str:
    return next((c.__name__ for c in type(p).__mro__ if c.__name__ in _KINDS), "")


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return [_row(headers), "|" + "---|" * len(headers), *(_row(row) for row in rows)]


def _row(cells) -> str:
    """One Markdown table row: a `|` inside a cell is escaped, a line break becomes a space."""
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
