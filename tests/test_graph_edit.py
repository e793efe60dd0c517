"""GraphEditor's small services that every pass relies on."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from fuse_cli.graph.edit import GraphEditor


@pytest.mark.parametrize("value", [np.float32(0.5), np.array(3, np.int64), np.zeros((2, 3), np.float16),
                                   np.arange(6, dtype=np.float32).reshape(2, 3).T],
                         ids=["scalar", "0-d array", "matrix", "non-contiguous"])
def test_a_constant_keeps_its_rank_dtype_and_values(value):
    """np.ascontiguousarray alone makes a 0-d value 1-D: a folded scalar would gain a rank."""
    g = GraphEditor(gs.Graph(), opset=17, shapes={}, dtypes={})
    made = g.constant("c", value).values
    assert made.shape == np.shape(value) and made.dtype == np.asarray(value).dtype
    assert np.array_equal(made, value) and made.flags["C_CONTIGUOUS"]
