"""jaxort.onnxblock's contexts and building blocks (jaxort/training/artifacts/blocks/).

Each block's graph is run with onnxruntime inference and compared with numpy.
tests/onnxblock/test_ort.py compares the graphs with ORT's own blocks.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from jaxort import onnxblock
from jaxort.errors import StateError, TrainingError
from jaxort.onnxblock import blocks


def _base(shape=(3, 4), dtype=TensorProto.FLOAT, opset=17) -> onnx.ModelProto:
    """Inputs x and y; one Identity so that the model is valid before any block."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["out"])], "base",
        [helper.make_tensor_value_info(n, dtype, list(shape)) for n in ("x", "y")],
        [helper.make_tensor_value_info("out", dtype, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


class _Apply(onnxblock.ForwardBlock):
    """Applies one block to the named values; its output becomes the graph output."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def build(self, *names):
        return self.block(*names)


def _apply(block, *names, base=None):
    forward = _Apply(block)
    with onnxblock.base(base if base is not None else _base()):
        forward(*names)
    return forward.to_model_proto()


X = np.array([[0.5, -1.0, 2.0, 0.25], [1.5, -0.75, 0.1, -2.0], [3.0, 0.2, -0.3, 1.0]], np.float32)
Y = np.array([[1.0, 2.0, 0.5, 4.0], [0.25, 1.5, 2.5, 1.0], [2.0, 0.5, 1.0, 3.0]], np.float32)


@pytest.mark.parametrize("block, names, expected", [
    (blocks.Add, ("x", "y"), X + Y),
    (blocks.Sub, ("x", "y"), X - Y),
    (blocks.Mul, ("x", "y"), X * Y),
    (blocks.Div, ("x", "y"), X / Y),
    (lambda: blocks.Pow(3.0), ("x",), X ** 3),
    (blocks.Neg, ("x",), -X),
    (blocks.Abs, ("x",), np.abs(X)),
    (blocks.Log, ("y",), np.log(Y)),
    (blocks.Sigmoid, ("x",), 1 / (1 + np.exp(-X))),
    (blocks.ReduceMean, ("x",), X.mean(keepdims=True)),
    (lambda: blocks.ReduceMean(keepdims=False), ("x",), X.mean()),
    (blocks.ReduceSum, ("x",), X.sum(keepdims=True)),
    (lambda: blocks.ReduceSum(keepdims=False), ("x",), X.sum()),
    (lambda: blocks.Clip(-0.5, 0.5), ("x",), np.clip(X, -0.5, 0.5)),
    (lambda: blocks.Clip(clip_max=0.2), ("x",), np.minimum(X, 0.2)),
    (lambda: blocks.Clip(0.1), ("x",), np.maximum(X, 0.1)),
    (lambda: blocks.Cast(TensorProto.DOUBLE), ("x",), X.astype(np.float64)),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_block_values_match_numpy(block, names, expected, helpers):
    model = _apply(block(), *names)
    (got,) = helpers.ort_run(model, {"x": X, "y": Y})
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


class _ScaledSum(onnxblock.Block):
    # ORT's documented custom-block pattern: blocks made in __init__, called in build.
    def __init__(self):
        super().__init__()
        self.add, self.mul, self.w = blocks.Add(), blocks.Mul(), blocks.Constant(2.5)

    def build(self, a, b):
        return self.add(a, self.mul(self.w(), b))


def test_custom_block_of_blocks(helpers):
    (got,) = helpers.ort_run(_apply(_ScaledSum(), "x", "y"), {"x": X, "y": Y})
    np.testing.assert_allclose(got, X + 2.5 * Y, rtol=1e-6)


def test_names_are_numbered_in_the_order_ort_draws_them():
    # Output name, then node name, one count per context (ORT counts per process).
    with onnxblock.base(_base(), name_offset=10) as accessor:
        out = blocks.Pow(2.0)(blocks.Sub()("x", "y"))
        assert accessor.name_count == 15
    model = accessor.model
    assert out == "onnx::pow_output::14"
    assert [(n.op_type, n.name, list(n.output)) for n in model.graph.node[1:]] == [
        ("Sub", "onnx::Sub::12", ["onnx::sub_output::11"]),
        ("Pow", "onnx::Pow::15", ["onnx::pow_output::14"]),
    ]
    assert [t.name for t in model.graph.initializer] == ["onnx::pow_exponent::13"]


def test_pow_draws_exponent_then_output_then_node():
    with onnxblock.base(_base()) as accessor:
        assert blocks.Pow(2.0)("x") == "onnx::pow_output::2"
    (init,) = accessor.model.graph.initializer
    assert (init.name, init.data_type, list(init.dims), list(init.float_data)) == (
        "onnx::pow_exponent::1", TensorProto.FLOAT, [1], [2.0])
    assert accessor.model.graph.node[-1].name == "onnx::Pow::3"


def test_linear_is_a_gemm_with_normal_initializers(helpers):
    model = _apply(blocks.Linear(4, 2, rng=np.random.default_rng(7)), "x")
    draw = np.random.default_rng(7)
    w = draw.standard_normal((4, 2)).astype(np.float32)
    b = draw.standard_normal(2).astype(np.float32)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert sorted(inits) == ["onnx::linear.bias::2", "onnx::linear.weight::1"]
    np.testing.assert_array_equal(inits["onnx::linear.weight::1"], w)
    (got,) = helpers.ort_run(model, {"x": X, "y": Y})
    np.testing.assert_allclose(got, X @ w + b, rtol=1e-5, atol=1e-6)
    # Without rng: numpy's global generator, as ORT (seeded, repeatable).
    np.random.seed(3)
    model = _apply(blocks.Linear(4, 2, bias=False), "x")
    np.random.seed(3)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(model.graph.initializer[0]),
                                  np.random.randn(4, 2).astype(np.float32))


def test_input_like_clones_the_type_and_shape():
    with onnxblock.base(_base(shape=(2, 7))) as accessor:
        assert blocks.InputLike("out")("target") == "target"
        assert blocks.InputLike("x")() == "onnx::input::1"
    inputs = {i.name: i.type for i in accessor.model.graph.input}
    assert inputs["target"] == inputs["x"] == inputs["onnx::input::1"]


def test_sequence_construct_and_pass_through(helpers):
    model = _apply(blocks.SequenceConstruct(), "x", "y")
    (got,) = helpers.ort_run(model, {"x": X, "y": Y})
    np.testing.assert_array_equal(got[0], X)
    np.testing.assert_array_equal(got[1], Y)
    with onnxblock.base(_base()) as accessor:
        assert blocks.PassThrough()("x", "y") == ("x", "y")
    assert len(accessor.model.graph.node) == 1


def test_label_encoder_maps_keys_and_imports_its_domain(helpers):
    base = _base(dtype=TensorProto.INT64)
    model = _apply(blocks.LabelEncoder(keys_int64s=[1, 2, 3], values_floats=[0.5, 1.5, 2.5], default_float=-1.0),
                   "x", base=base)
    assert {o.domain: o.version for o in model.opset_import}["ai.onnx.ml"] == 2
    keys = np.array([[1, 3, 9, 2], [2, 2, 1, 0], [3, 3, 3, 3]], np.int64)
    (got,) = helpers.ort_run(model, {"x": keys, "y": keys})
    np.testing.assert_array_equal(got, np.array(
        [[0.5, 2.5, -1.0, 1.5], [1.5, 1.5, 0.5, -1.0], [2.5, 2.5, 2.5, 2.5]], np.float32))


def test_reduce_all_l2_is_ort_node_with_known_output_type():
    with onnxblock.base(_base()) as accessor:
        out = blocks.ReduceAllL2()("x", "y")
    node = accessor.model.graph.node[-1]
    assert (node.domain, node.op_type, list(node.input), list(node.output)) == (
        "com.microsoft", "ReduceAllL2", ["x", "y"], [out])
    (vi,) = accessor.model.graph.value_info
    assert vi.name == out and vi.type.tensor_type.elem_type == TensorProto.FLOAT


def test_forward_block_makes_its_outputs_the_graph_outputs():
    model = _apply(blocks.Add(), "x", "y")
    assert [o.name for o in model.graph.output] == ["onnx::add_output::1"]
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [3, 4]


def test_empty_base_is_orts_empty_model():
    with onnxblock.empty_base(opset_version=17) as accessor:
        model = accessor.model
        assert not accessor.has_path
    assert (model.ir_version, model.producer_name, model.graph.name) == (10, "orttraining", "graph")
    assert [(o.domain, o.version) for o in model.opset_import] == [("com.microsoft", 1), ("", 17)]
    with onnxblock.empty_base() as accessor:
        assert accessor.model.opset_import[1].version == 21  # the newest ORT 1.19.2 reads


def test_base_copies_the_model_and_keeps_the_path():
    model = _base()
    with onnxblock.base(model, "some/model.onnx") as accessor:
        blocks.Neg()("x")
        assert accessor.has_path and accessor.path == "some/model.onnx"
    assert len(model.graph.node) == 1 and len(accessor.model.graph.node) == 2


# --------------------------------------------------------------------------- errors


def test_a_block_outside_a_base_context_is_a_state_error():
    with pytest.raises(StateError, match=r"block Add was called outside a base model context.*onnxblock.base"):
        blocks.Add()("x", "y")
    assert isinstance(StateError("x"), RuntimeError)  # ORT raises RuntimeErrors for these


def test_one_base_at_a_time_and_closed_after_an_error():
    with onnxblock.base(_base()):
        with pytest.raises(StateError, match="already open"):
            with onnxblock.empty_base():
                pass
    with pytest.raises(TrainingError):
        with onnxblock.base(_base()):
            blocks.Add()("x", "nowhere")
    with onnxblock.base(_base()) as accessor:  # the failed context was closed
        blocks.Neg()("x")
    assert accessor.model.graph.node[-1].op_type == "Neg"


def test_the_open_model_belongs_to_one_thread():
    seen = []
    with onnxblock.base(_base()):
        worker = threading.Thread(target=lambda: seen.append(_try(lambda: blocks.Neg()("x"))))
        worker.start()
        worker.join()
    assert seen == ["StateError"]


def _try(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  the test reports the class
        return type(e).__name__
    return "ok"


def test_an_invalid_graph_names_the_block():
    with onnxblock.base(_base()):
        with pytest.raises(TrainingError, match=r"after block _ScaledSum is not a valid ONNX model.*nowhere"):
            _ScaledSum()("x", "nowhere")


@pytest.mark.parametrize("make, message", [
    (lambda: onnxblock.base("model.onnx").__enter__(), "needs an onnx.ModelProto"),
    (lambda: onnxblock.empty_base(opset_version=0).__enter__(), "opset_version must be a positive int"),
    (lambda: onnxblock.base(_base(), name_offset=-1).__enter__(), "name_offset"),
    (lambda: blocks.Clip(1.0, 0.0), "clip_min 1.0 is greater than clip_max 0.0"),
    (lambda: onnxblock.custom_op_library("libcustom.so").__enter__(), "libcustom.so.*no ONNX Runtime kernels"),
])
def test_bad_arguments_are_training_errors(make, message):
    with pytest.raises(TrainingError, match=message):
        make()


def test_to_model_proto_before_building_is_a_state_error():
    with pytest.raises(StateError, match="has not built its model yet"):
        _Apply(blocks.Neg()).to_model_proto()


def test_a_block_returning_no_names_is_refused():
    class Nothing(onnxblock.ForwardBlock):
        def build(self, name):
            return 3

    with onnxblock.base(_base()):
        with pytest.raises(TrainingError, match=r"Nothing.build returned 3"):
            Nothing()("x")
