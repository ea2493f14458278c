"""ONNX Runtime contrib ops (domain com.microsoft) that appear in forward graphs.

ONNX Runtime Training 1.19.2 rewrites some standard ops when it builds
training_model.onnx (BatchNormalization becomes BatchNormInternal); jaxort
runs the forward part of those graphs, so it needs their forward semantics.
"""

from jaxort.graph import register
from jaxort.graph.ops._common import batch_norm


@register("BatchNormInternal", since=1, domain="com.microsoft")
def batch_norm_internal(x, scale, b, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                        training_mode=1, ctx):
    """com.microsoft::BatchNormInternal-1 (outputs Y, running mean/var, saved mean, saved inv std)."""
    y, run_mean, run_var, saved_mean, saved_var = batch_norm(
        x, scale, b, input_mean, input_var, epsilon=epsilon, momentum=momentum,
        training=bool(training_mode), ctx=ctx)
    saved_inv_std = (1.0 / (saved_var.astype(run_var.dtype) + epsilon) ** 0.5).astype(x.dtype)
    return y, run_mean, run_var, saved_mean, saved_inv_std
