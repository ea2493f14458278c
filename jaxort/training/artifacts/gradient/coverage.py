"""Which ops have a gradient rule, which do not and why, and which ONNX Runtime 1.19.2 has a builder for.

``docs/gradient-coverage.md`` is written from these tables
(``tools/make_gradient_table.py``); a test checks that every op jaxort
registers whose schema takes and gives floats has a rule or a reason here.

Part of the training layer: it imports onnx and the graph layer's registry only.
"""

from __future__ import annotations

from onnx import defs

#: default-domain op type -> why it has no gradient rule.
WITHOUT_RULE: dict = {
    "BatchNormalization": "written as com.microsoft::BatchNormInternal before the rules run (its rule is "
                          "in MS_RULES), as ORT's generate_artifacts does",
    "Loop": "its gradient needs every iteration's values, kept by the forward and read back by a loop "
            "running backwards; not written (If has a rule)",
    "Scan": "its gradient needs every iteration's values, kept by the forward and read back by a scan "
            "running backwards; not written (If has a rule)",
    "Scatter": "deprecated since opset 11; the rules need opset 13 or newer",
    "Upsample": "deprecated since opset 10; the rules need opset 13 or newer (Resize has a rule)",
    "BitCast": "reinterprets bits: no gradient",
    "DequantizeLinear": "quantization: not on a float training path",
    "DynamicQuantizeLinear": "quantization: not on a float training path",
    "OptionalGetElement": "optional values: not on a tensor training path",
    "Range": "its inputs set the output's length, so they must be constants to trace (jaxort folds "
             "them at trace time): no trainable parameter reaches them",
    "Unique": "its output's shape depends on its input's values: jaxort traces it only on constants, "
              "which no trainable parameter reaches",
    "MelWeightMatrix": "a constant of its integer inputs: no gradient",
}

#: default-domain op types with no rule of their own that the generator replaces by the
#: function body ONNX defines for them, whose ops have rules (``expand.py``).
FUNCTION_BODY = frozenset({"Attention"})

#: default-domain control flow ops with a gradient (``control.py``): not a rule of ``RULES``, as
#: it differentiates the node's subgraphs with the rules.
CONTROL_FLOW = frozenset({"If"})

#: The default-domain ops onnxruntime-training 1.19.2 has a gradient builder for: the
#: ``Get<Op>Gradient`` builder classes in its library (onnxruntime_pybind11_state.so),
#: by the op each is registered for. BatchNormalization's is registered for BatchNormInternal,
#: LSTM's and GRU's for LSTMTraining and GRUTraining, the forms generate_artifacts writes.
ORT_1_19_2_BUILDERS = frozenset({
    "Abs", "Add", "AveragePool", "BatchNormalization", "Cast", "Clip", "Concat", "Conv", "ConvTranspose",
    "Cos", "Div", "Dropout", "Erf", "Exp", "Expand", "Flatten", "GRU", "Gather", "GatherElements",
    "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "Identity", "LSTM", "LayerNormalization", "LeakyRelu",
    "Log", "LogSoftmax", "MatMul", "Max", "MaxPool", "Min", "Mul", "Neg", "Pad", "Pow", "Reciprocal",
    "ReduceL2", "ReduceLogSumExp", "ReduceMean", "ReduceSum", "Relu", "Reshape", "Resize",
    "ScatterElements", "ScatterND", "Sigmoid", "Sin", "Slice", "Softmax", "SoftmaxCrossEntropyLoss",
    "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Where",
})

_FLOAT = "tensor(float)"


def float_ops() -> list:
    """The default-domain ops jaxort registers whose schema (in the installed onnx) takes a float
    input and gives a float output: the ones a gradient can flow through."""
    import jaxort.graph.ops  # noqa: F401  (fills the registry)
    from jaxort.graph import registered

    out = []
    for op in sorted({h.op_type for h in registered() if h.domain in ("", "ai.onnx")}):
        try:
            schema = defs.get_schema(op)
        except defs.SchemaError:  # newer than the installed onnx
            continue
        types = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

        def floats(param):
            return _FLOAT in types.get(param.type_str, {param.type_str})

        if any(floats(p) for p in schema.inputs) and any(floats(p) for p in schema.outputs):
            out.append(op)
    return out
