"""How tests/data/flax_ln_gelu_jax2tf.onnx was made (a real jax2tf + tf2onnx export, kept small):
a Flax LayerNorm, Dense and tanh GELU, converted with jax2tf (native_serialization=False,
enable_xla=False) and tf2onnx 1.16.1 at opset 17, in a venv of tensorflow-cpu 2.15.1, jax 0.4.23,
flax 0.7.5, onnx 1.16.2. tf2onnx leaves TF's PreventGradient node in; it was replaced by Identity.
Not run by the tests (they use the .onnx); kept so the export can be made again.
"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import jax
import jax.numpy as jnp
import flax.linen as nn
import tensorflow as tf
from jax.experimental import jax2tf
import tf2onnx

class M(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm()(x)
        x = nn.Dense(16)(x)
        return nn.gelu(x)  # approximate=True: the tanh form

m = M()
x = jnp.ones((2, 5, 16), jnp.float32)
params = m.init(jax.random.PRNGKey(0), x)
params = jax.tree_util.tree_map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(1), p.shape), params)
f = jax2tf.convert(lambda x: m.apply(params, x), polymorphic_shapes=["(b, s, 16)"], with_gradient=False,
                   native_serialization=False, enable_xla=False)
spec = [tf.TensorSpec([None, None, 16], tf.float32, name="x")]
model, _ = tf2onnx.convert.from_function(tf.function(f, autograph=False), input_signature=spec, opset=17,
                                         output_path="flax_ln_gelu.onnx")
print("ok", [n.op_type for n in model.graph.node])
