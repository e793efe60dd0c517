"""Decomposed normalizations in the forms exporters write them, shared by the norm pass tests."""

from __future__ import annotations

import numpy as np

from tests.graphs import GraphBuilder


def rms_norm(b: GraphBuilder, x: str, *, axes=(-1,), square="pow", divide="div", gamma_shape=(16,),
             commuted=False, eps_input=False, reader=False, centered=False) -> list[str]:
    """x / sqrt(mean(x^2) + eps) * gamma as T5/Llama exports write it (`divide`: "div",
    "reciprocal" or "rsqrt" = Div(1, Sqrt); `centered` feeds x - mean(x) instead of x;
    `gamma_shape=None` leaves Mul(gamma) out); returns [y] plus a reader of the squares if asked."""
    def reduce_mean(t):
        if b.opset >= 18:
            return b.op("ReduceMean", t, b.const(list(axes), dtype=np.int64), keepdims=1)
        return b.op("ReduceMean", t, axes=list(axes), keepdims=1)

    if centered:
        x = b.op("Sub", x, reduce_mean(x))
    squared = b.op("Pow", x, b.const(2.0)) if square == "pow" else b.op("Mul", x, x)
    eps = b.input("eps", []) if eps_input else b.const(1e-6)
    rms = b.op("Sqrt", b.op("Add", *((eps, reduce_mean(squared)) if commuted else (reduce_mean(squared), eps))))
    if divide == "div":
        y = b.op("Div", x, rms)
    else:
        inverse = b.op("Reciprocal", rms) if divide == "reciprocal" else b.op("Div", b.const(1.0), rms)
        y = b.op("Mul", *((inverse, x) if commuted else (x, inverse)))
    if gamma_shape is not None:
        gamma = b.const(b.rand(*gamma_shape, low=0.5, high=1.5))
        y = b.op("Mul", *((gamma, y) if commuted else (y, gamma)))
    return [y] + ([b.op("Neg", squared, name="reader")] if reader else [])
