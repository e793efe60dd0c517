"""Renderers of `fuse passes`: the pipeline for a target, the capability table, one pass explained."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fuse_cli.passes import REGISTRY, pipeline_for
from fuse_cli.pipeline.base import Pass
from fuse_cli.targets import CAPABILITY_HEADERS, capability_rows


def render_explanation(chosen: Pass, console: Console) -> None:
    console.print(f"[bold]{chosen.name}[/bold]: {chosen.description}\n", highlight=False)
    console.print(chosen.explanation, highlight=False, markup=False)


def render_passes(target: str, console: Console) -> None:
    default = pipeline_for(target)
    table = Table(title=f"Passes (target {target}; * = in the default pipeline, in run order)", title_justify="left")
    table.add_column("Pass", no_wrap=True)  # whole, to copy into --passes / --disable
    for header in ("Default", "Min opset", "Targets", "Description"):
        table.add_column(header)
    for name in list(default) + sorted(set(REGISTRY) - set(default)):
        p = REGISTRY[name]
        table.add_row(name, "*" if name in default else "", str(p.required_opset(target)), ",".join(sorted(p.targets)),
                      p.description)
    console.print(table)
    if target != "onnx":
        capabilities = Table(title=f"onnxruntime fused operators and where they run (target {target})",
                             title_justify="left")
        for header in CAPABILITY_HEADERS:
            capabilities.add_column(header, overflow="fold")
        for row in capability_rows(target):
            capabilities.add_row(*row)
        console.print(capabilities)
