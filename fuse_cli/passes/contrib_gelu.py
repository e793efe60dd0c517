"""GELU -> onnxruntime's fused kernels: Gelu (Erf form) and FastGelu (tanh form). QuickGelu and
BiasGelu are quick_gelu.py and bias_gelu.py; the shared pass is toolkit/activation_pass.py."""

from __future__ import annotations

from fuse_cli.match import Alt, Op
from fuse_cli.pipeline.registry import register
from fuse_cli.toolkit.activation_pass import BIASED_X, ActivationPass, approximated
from fuse_cli.toolkit.activations import ERF_GATE, TANH_GATE, X, decomposed_gelu


@register
class FuseContribGelu(ActivationPass):
    """gelu(x) = x * 0.5 * (1 + erf(x / sqrt(2)))  -> com.microsoft Gelu, at any opset

        x ─┬─ Div(sqrt 2) ── Erf ── Add(1) ─┐
           └─────────────────────────────── Mul ── Mul(0.5) ── y      =>   x ── Gelu ── y

    The forms gelu matches (which needs opset 20), and a standard Gelu (approximate="none").
    """

    name = "contrib-gelu"
    description = "Fuse an Erf GELU (or a standard Gelu) into onnxruntime's Gelu"
    label = "Erf GELU -> com.microsoft Gelu"
    fused_op = "Gelu"
    emits = ("com.microsoft::Gelu",)
    pattern = Alt(decomposed_gelu(ERF_GATE), Op("Gelu", X, name="gelu", approximate=approximated("none")))


@register
class FuseFastGelu(ActivationPass):
    """y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),  x = input (+ bias)  -> FastGelu

        input ── Add(bias) = x ─┬─ (x + 0.044715 x^3) ── Mul(sqrt(2/pi)) ── Tanh ── Add(1) ─┐
                                └──────────────────────────────────────────────────────── Mul ── Mul(0.5)
          =>  input ── FastGelu(bias?) ── y

    x^3 as Pow(x, 3) or x * (x * x); or a standard Gelu(approximate="tanh"). A constant bias over
    the last axis only is absorbed as FastGelu's 1-D bias input.
    """

    name = "fast-gelu"
    description = "Fuse a tanh GELU (and the bias Add before it) into onnxruntime's FastGelu"
    label = "tanh GELU (+ bias) -> FastGelu"
    fused_op = "FastGelu"
    emits = ("com.microsoft::FastGelu",)
    pattern = Alt(decomposed_gelu(TANH_GATE, Alt(BIASED_X, X)),
                  Op("Gelu", Alt(BIASED_X, X), name="gelu", approximate=approximated("tanh")))
