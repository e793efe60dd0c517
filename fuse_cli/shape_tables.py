"""The shape tables of one run, built in one place, each with one name and one use.

- planner: onnx's inference, no dim bound: shapes as onnxruntime's allocation planner compares
  them (the memory model's buffer reuse);
- proofs: the planner's table plus the dims onnxruntime's symbolic inference names without
  merging symbols: what fusion checks may rely on (a merged name proves nothing, see
  analysis/shapes.with_runtime_dims);
- bound: sizes at the user's bindings (input_domain.binding: --dim and --input-shape as one), symbols
  and position keys nobody bound at 1 (listed in `assumed`): the bytes of the memory estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx

from fuse_cli.analysis.body_shapes import body_shapes
from fuse_cli.analysis.shapes import ShapeTable, infer_shapes, with_runtime_dims
from fuse_cli.config import UNBOUND_DIM, FuseConfig
from fuse_cli.errors import UsageError
from fuse_cli.core.feeds import position_key
from fuse_cli.graph.checks import check_tensor_size
from fuse_cli.input_domain import free_symbols, input_dim_keys, is_placeholder, with_declared_arithmetic


@dataclass(frozen=True)
class ShapeTables:
    planner: ShapeTable
    proofs: ShapeTable
    bound: ShapeTable
    assumed: tuple[str, ...]  # symbols nobody bound, taken as 1 in `bound`
    # (element type, shape) of the tensors inside If/Loop/Scan bodies, for the checks of passes
    # that run there (analysis/body_shapes.py); the tables above hold the main graph's
    inside: Mapping[str, tuple[int, tuple | None]] = field(default_factory=dict)


def build_shape_tables(model: onnx.ModelProto, config: FuseConfig) -> ShapeTables:
    planner = infer_shapes(model)
    proofs = with_runtime_dims(model, planner, proofs=True)
    bound, assumed = _bound_shapes(model, config, unbound_table=planner)
    for table in (planner, bound):
        # a computed shape no run could hold (a Reshape to [2**62]) is bad input, refused here
        # before numpy overflows on it in the memory audit or verification
        for name, info in table.tensors.items():
            if info.shape is not None:
                check_tensor_size(name, [d if isinstance(d, int) else None for d in info.shape], "shape inference")
    return ShapeTables(planner, proofs, bound, assumed, body_shapes(model))


def _bound_shapes(model: onnx.ModelProto, config: FuseConfig, assumed: tuple[str, ...] | None = None, *,
                  unbound_table: ShapeTable | None = None) -> tuple[ShapeTable, tuple[str, ...]]:
    """Shapes at the user's bindings. Symbolic dims nobody bound are taken as 1 (and returned, so
    the report says so); binding happens before inference because data propagation through
    Shape/Reshape arithmetic only yields sizes for values known up front.

    unbound_table: the model's inference without bindings, when the caller has it; with no dims
    and no input shapes given it is the first table, and is not computed again. Each inference
    of a deep model takes longer than loading it. Never sized from the proofs table: it names a
    dim by its sizes at two prime settings, which a Max(N, 3) only matches there, not at 1."""
    # A dim written as arithmetic of symbols (`past_sequence + sequence`) is computed from them,
    # never bound or assumed on its own: a decode step's mask is as wide as past and new together,
    # and so is its present K/V, where only the outputs declare that dim.
    free = set(free_symbols(model))
    arithmetic = set(with_declared_arithmetic(model, dict.fromkeys(free, UNBOUND_DIM))) - free
    try:
        if unbound_table is not None and not config.dims and not config.input_shapes:
            table = unbound_table
        else:
            table = infer_shapes(model, with_declared_arithmetic(model, config.dims), config.input_shapes,
                                 symbolic=True, outputs_declared=False)
        # a name only intermediates or outputs declare (paddle2onnx's `Reshape_470_o0__d2`) is no
        # size to choose: where inference sized a tensor declared with it, from the inputs, that is
        # its size; taken as 1, it pinned every tensor it declares at 1 (PP-OCRv6's recognizer:
        # 56.1 MB estimated, 98.8 MB allocated). Sized nowhere, it is taken as 1 like the rest.
        declared = declared_only_sizes(model, table, free | arithmetic)
        learned = {name: sizes.pop() for name, sizes in declared.items() if len(sizes) == 1}
        if assumed is None:
            # an input dim without a usable name ('?', -1, none) is assumed by its position key
            positional = {key for (name, index), key in input_dim_keys(model).items()
                          if key == position_key(name, index)}
            unknown = ({u.symbol for u in table.unknown_dims if u.symbol and not is_placeholder(u.symbol)}
                       | positional) - set(table.bound_dims)
            assumed = tuple(sorted(unknown - arithmetic - set(learned)))
        learned = {name: size for name, size in learned.items() if name not in table.bound_dims}
        if assumed or learned or arithmetic - set(table.bound_dims):
            values = with_declared_arithmetic(model, {**dict.fromkeys(assumed, UNBOUND_DIM), **learned,
                                                      **table.bound_dims})
            table = infer_shapes(model, values, config.input_shapes, symbolic=True, outputs_declared=False)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return table, assumed


def declared_only_sizes(model: onnx.ModelProto, table: ShapeTable, inputs_carry) -> dict[str, set[int]]:
    """Dim names declared on value_info or graph outputs that no graph input carries, each with the
    sizes `table` inferred at the places they are declared (an empty set: sized nowhere, or the
    declaration's rank is not the inferred one)."""
    carried = set(inputs_carry)
    sizes: dict[str, set[int]] = {}
    for value in (*model.graph.value_info, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        inferred = table.get(value.name)
        shape = inferred.shape if inferred is not None and inferred.shape is not None else None
        for index, dim in enumerate(dims):
            if not dim.dim_param or dim.dim_param in carried:
                continue
            found = sizes.setdefault(dim.dim_param, set())
            if shape is not None and len(shape) == len(dims) and isinstance(shape[index], int):
                found.add(shape[index])
    return sizes
