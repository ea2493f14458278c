"""Mixed precision: float32 master weights, low-precision compute.

A :class:`Policy` on a :class:`jaxort.training.TrainProgram` keeps parameters,
gradients, optimizer moments and the loss in float32 while the graph computes
in ``compute_dtype`` (bfloat16 by default): the traced model is a copy whose
float32 tensors (graph inputs, initializers, Constant values, Cast targets)
are ``compute_dtype``; parameters and float inputs are cast on entry, so the
gradient with respect to the float32 master weights comes back in float32;
outputs (the loss included) are cast back to float32, and the optimizer
works in float32 as ORT's kernels do. Reductions over the batch inside the
loss then run in ``compute_dtype`` with the ops' own accumulation rules.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from jaxort.errors import TrainingError

__all__ = ["Policy", "bfloat16_policy", "cast_model"]

_ONNX_OF = {
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float32): TensorProto.FLOAT,
}


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which dtypes parameters, computation and outputs use.

    Attributes:
      param_dtype: dtype of the master weights and the optimizer (float32).
      compute_dtype: dtype the graph computes in.
      output_dtype: dtype of returned outputs and of the loss.
    """

    param_dtype: np.dtype = np.dtype(np.float32)
    compute_dtype: np.dtype = np.dtype(ml_dtypes.bfloat16)
    output_dtype: np.dtype = np.dtype(np.float32)

    def __post_init__(self):
        for f in ("param_dtype", "compute_dtype", "output_dtype"):
            object.__setattr__(self, f, np.dtype(getattr(self, f)))
        if self.compute_dtype not in _ONNX_OF:
            raise TrainingError(f"unsupported compute dtype {self.compute_dtype}")

    def cast_to_compute(self, x):
        """Casts a float32 array to ``compute_dtype``; other dtypes pass through."""
        if jnp.asarray(x).dtype == self.param_dtype:
            return jnp.asarray(x).astype(self.compute_dtype)
        return x

    def cast_to_output(self, x):
        """Casts a floating array to ``output_dtype``; other dtypes pass through."""
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating):
            return jnp.asarray(x).astype(self.output_dtype)
        return x


def bfloat16_policy() -> Policy:
    """float32 master weights and optimizer, bfloat16 compute, float32 loss and outputs.

    Returns:
      The policy.
    """
    return Policy()


def _retype(type_proto: onnx.TypeProto, to: int) -> None:
    if type_proto.HasField("tensor_type") and type_proto.tensor_type.elem_type == TensorProto.FLOAT:
        type_proto.tensor_type.elem_type = to


def _cast_tensor(t: onnx.TensorProto, dtype: np.dtype) -> onnx.TensorProto:
    if t.data_type != TensorProto.FLOAT:
        return t
    arr = numpy_helper.to_array(t).astype(dtype)
    new = helper.make_tensor(t.name, _ONNX_OF[dtype], arr.shape,
                             arr.view(np.uint16).reshape(-1).tobytes() if dtype.itemsize == 2
                             else arr.tobytes(), raw=True)
    return new


def _cast_graph(graph: onnx.GraphProto, dtype: np.dtype) -> None:
    to = _ONNX_OF[dtype]
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        _retype(vi.type, to)
    inits = [_cast_tensor(t, dtype) for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                attr.t.CopyFrom(_cast_tensor(attr.t, dtype))
            elif attr.type == onnx.AttributeProto.GRAPH:
                _cast_graph(attr.g, dtype)
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = to


def cast_model(model: onnx.ModelProto, dtype) -> onnx.ModelProto:
    """Returns a copy of ``model`` computing in ``dtype`` instead of float32.

    Float32 graph inputs, outputs, value infos, initializers, tensor
    attributes (Constant, ConstantOfShape) and ``Cast(to=FLOAT)`` targets
    become ``dtype``.

    Args:
      model: the model.
      dtype: bfloat16 or float16.

    Returns:
      The new model.
    """
    dtype = np.dtype(dtype)
    if dtype not in _ONNX_OF:
        raise TrainingError(f"unsupported compute dtype {dtype}")
    new = onnx.ModelProto()
    new.CopyFrom(model)
    if dtype != np.dtype(np.float32):
        _cast_graph(new.graph, dtype)
    return new
