
from tests.conftest import assert_equivalent, optimize_model
from tests.graphs import GraphBuilder, op_counts


def test_conv_bn_folds_and_matches(tmp_path):
    b = GraphBuilder()
    x = b.input("x", [2, 3, 8, 8])
    c = b.op("Conv", x, b.const(b.rand(4, 3, 3, 3)), pads=[1, 1, 1, 1])
    y = b.op("BatchNormalization", c, b.const(b.rand(4, low=0.5, high=1.5)), b.const(b.rand(4)),
             b.const(b.rand(4)), b.const(b.rand(4, low=0.5, high=2.0)), epsilon=1e-3)
    model = b.build(y, output_names=["y"])
    result = optimize_model(model, tmp_path)
    assert op_counts(result.model) == {"Conv": 1}
    assert_equivalent(model, result.model)
