"""Imports point down the layer table of docs/ARCHITECTURE.md, and no pass imports another pass.

Every module's imports are read from its source (each `import` and `from ... import`, wherever it
stands: a function-level import is a dependency too), so the test needs no package to load."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fuse_cli"

# docs/ARCHITECTURE.md's table, top to bottom: a module may import its own layer and those below.
# Each entry is a module or a package prefix (dotted, under fuse_cli); the longest prefix decides.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("command line", ("__main__", "launch", "cli", "cli_options")),
    ("library entry", ("api", "batch", "bench", "public")),
    ("promises", ("promises", "load_check", "rollback", "verify", "audit")),
    ("report", ("report",)),
    ("one pipeline run", ("fusing", "shape_tables")),
    ("passes", ("passes",)),
    ("pass machinery", ("pipeline", "toolkit", "match", "targets", "kernel_contracts")),
    ("node order", ("scheduling",)),
    ("graph", ("graph",)),
    ("analysis", ("analysis", "input_domain")),
    ("operators", ("ops",)),
    ("bottom", ("core", "config", "errors", "progress", "")),  # "": the package's own __init__
)
# The package's __init__ (its __version__ and errors: the bottom) hands out the Python API,
# public.py, on first use: that one lazy import is the facade's, not a dependency.
FACADE = ("", "public")
RANK = {prefix: rank for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The rank of the longest prefix that names `module` (0: the top)."""
    parts = module.split(".") if module else []
    for end in range(len(parts), -1, -1):
        prefix = ".".join(parts[:end])
        if prefix in RANK:
            return RANK[prefix]
    raise AssertionError(f"fuse_cli.{module} is in no layer of the table: add it to LAYERS and ARCHITECTURE.md")


def imported_modules(path: Path) -> set[str]:
    """The fuse_cli modules `path` imports, relative to the package ("" is fuse_cli itself);
    `from fuse_cli.x import y` counts as fuse_cli.x.y where y is a module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "fuse_cli":
            base = node.module.removeprefix("fuse_cli").lstrip(".")
            found.add(base)
            for alias in node.names:
                name = f"{base}.{alias.name}".lstrip(".")
                if _is_module(name):
                    found.add(name)
        elif isinstance(node, ast.Import):
            found |= {alias.name.removeprefix("fuse_cli").lstrip(".") for alias in node.names
                      if alias.name.split(".")[0] == "fuse_cli"}
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


MODULES = sorted(PACKAGE.rglob("*.py"))


def upward_imports(path: Path) -> list[str]:
    module = module_name(path)
    rank = layer_of(module)
    return [f"fuse_cli.{module or '__init__'} ({LAYERS[rank][0]}) imports fuse_cli.{target} "
            f"({LAYERS[layer_of(target)][0]})" for target in sorted(imported_modules(path))
            if layer_of(target) < rank and (module, target) != FACADE]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p) or "__init__")
def test_imports_point_down_the_layer_table(path):
    assert not upward_imports(path)


@pytest.mark.parametrize("path", sorted((PACKAGE / "passes").glob("*.py")), ids=lambda p: p.stem)
def test_no_pass_imports_another_pass(path):
    """A pass imports the toolkit, never another pass (the registry package imports them all)."""
    others = {m for m in imported_modules(path) if m.startswith("passes.")} - {module_name(path)}
    assert path.stem == "__init__" or not others, others


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The parser finds a function-level import that points up (graph -> passes)."""
    fake = tmp_path / "fuse_cli"
    (fake / "graph").mkdir(parents=True)
    (fake / "passes").mkdir()
    (fake / "passes" / "conv_bn.py").write_text("")
    module = fake / "graph" / "io.py"
    module.write_text("def load():\n    from fuse_cli.passes import conv_bn\n    import fuse_cli.core\n")
    monkeypatch.setitem(globals(), "PACKAGE", fake)  # the functions read the module's PACKAGE
    assert upward_imports(module) == ["fuse_cli.graph.io (graph) imports fuse_cli.passes (passes)",
                                      "fuse_cli.graph.io (graph) imports fuse_cli.passes.conv_bn (passes)"]
