"""Per-op micro-benchmarks: the convolutional networks' training ops, jaxort against ONNX Runtime's CPU kernels.

What it measures. The op instances of the working-size models of
``benchmarks/scale.py`` (S1 ResNet-18 3x64x64 batch 8, S2 ResNet-50 224
batch 8, S3 MobileNetV3-Large 224 batch 16; ``build/bench-scale/<model>/model.onnx``,
exported by ``python benchmarks/scale.py export``), one op at a time, forward
and backward. The ops: Conv, in classes (stem/kxk: the first convolution or a
kernel over 3; 3x3 s1; 3x3 s2; pointwise 1x1; depthwise 3x3 and 5x5, group ==
channels), BatchNormalization (training mode), Relu, MaxPool,
GlobalAveragePool and AveragePool. An instance is an (op, input shapes,
attributes) triple, counted over the model; per model and class the instances
with the most work x count are timed (``--top``, 3 by default). Shapes come
from ``onnx.shape_inference`` of the model.

Systems, each on a one-node ONNX model of the instance (opset 17, weights as
graph inputs), timed in one process in interleaved rounds (order rotated round
by round; a round's sample of a system repeats it for at least
``--min-sample-ms``; figures are medians over rounds):

- ORT forward: an ``onnxruntime.InferenceSession`` (CPUExecutionProvider,
  default graph optimizations), of the form ORT Training 1.19.2's
  training graph runs: BatchNormalization as ``com.microsoft::BatchNormInternal``
  (batch statistics; outputs Y, running mean and variance, saved mean and
  inverse std; plain BatchNormalization with training_mode=1 where that
  kernel is missing), MaxPool with its Indices output.
- ORT backward: ORT's gradient kernels as one-node models in an
  InferenceSession, as its gradient builder writes them:
  ``com.microsoft::ConvGrad(dY, X, W) -> dX, dW, dB`` (dX left out for the
  first convolution, whose input needs no gradient),
  ``com.microsoft::BatchNormalizationGrad(dY, X, scale, saved_mean, saved_inv_std)``,
  ``com.microsoft::ReluGrad(dY, Y)``, ``MaxPoolGrad(dY, Indices)``,
  ``AveragePoolGrad(dY)``, and for GlobalAveragePool the three nodes
  ``Shape(X)``, ``com.microsoft::Scale(dY, H*W)``, ``Expand``. Where the
  installed onnxruntime has no such kernel (the inference-only package has
  none of them) the row says "no ORT kernel".
- jaxort forward: ``jax.jit`` of ``JaxGraph(model).apply(..., training=True)``,
  traced inside ``lowering_platform("cpu")`` (the CPU forms of the op
  handlers, as jaxort's compiled steps pick them on CPU).
- jaxort backward: the pullback of ``jax.vjp`` of the first output with
  respect to the inputs ORT's kernel differentiates (data input and weights),
  jitted on its own: residuals come from a jitted forward, so it times the
  backward alone, as the ORT kernel does from the forward's saved values.
- matmul: ``jnp.dot`` of two float32 d x d matrices, 2 d^3 about the Conv's
  forward FLOPs (Conv rows only), jitted like jaxort's.

Each op is a program (or session) of its own here, so every call pays the
per-call overhead a train step pays once for all its ops; each subprocess
reports it (a one-element program of jax and of ORT) beside its tables.

Work: Conv forward 2 N Co (Ci/group) prod(kernel) prod(output spatial) FLOPs,
backward twice that (dX and dW; once where dX is left out); the other ops
are memory-bound and report GB/s of float32 read and written (forward: X
and Y; backward: dY, X (BatchNormalization, Relu) and dX).

Checks, once per instance, reported and never raised: jaxort's forward
outputs against ORT's (rtol 1e-4, atol 1e-4 x max(1, max |reference|)),
jaxort's gradients against ORT's kernels where there are some (1e-3, likewise
scaled); with ``--smoke``, or where onnxruntime is not importable, the
forward also against ``onnx.reference`` (numpy) on the same model. Data
are float32 from a fixed seed, weights scaled by 1/sqrt(fan-in) so outputs
stay near 1 at every size.

Run (the oracle environment, which has onnxruntime-training, for the full
mode; each model x thread setting in its own subprocess; "pinned" calls
``os.sched_setaffinity(0, {0})`` before importing jax or onnxruntime and
gives ORT one intra- and one inter-op thread)::

    python benchmarks/ops_vs_ort.py [--models S1,S2,S3] [--threads default,pinned] [--out DIR]
        [--top 3] [--rounds 5] [--min-sample-ms 10]
    python benchmarks/ops_vs_ort.py --smoke [--out DIR]   # tiny synthetic ops, 2 rounds (the test's)

Writes ``benchmarks/results/ops_vs_ort.json`` and ``ops_vs_ort.md`` (``--out
DIR`` elsewhere; ``--smoke`` writes to a temporary directory unless given one):
the command and machine, a table of instances per thread setting, and per
model and class the sum over instances of count x time ("where the step's
time goes", for the instances timed; coverage says how much of the class's
work x count they are, and a last line per model scales each class's sum up
by it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from suite import _cpu_model  # noqa: E402 - a script beside this one
CACHE = os.path.join(ROOT, "build", "bench-scale")
MODELS = ("S1", "S2", "S3")
THREADS = ("default", "pinned")
OPS = ("Conv", "BatchNormalization", "Relu", "MaxPool", "GlobalAveragePool", "AveragePool")
MS = "com.microsoft"
OPSET = 17
SEED = 0
FWD_TOL = 1e-4
BWD_TOL = 1e-3
NO_KERNEL = "no ORT kernel"
MAX_REPS = 2000
INPUT_NAMES = {"Conv": ("X", "W", "B"), "BatchNormalization": ("X", "scale", "B", "input_mean", "input_var")}
OUTPUT_NAMES = ("Y", "running_mean", "running_var")

# Tiny instances for --smoke: (op, input shapes, attributes, needs dX, count).
SMOKE = (
    ("Conv", [[2, 3, 16, 16], [8, 3, 7, 7]], dict(kernel_shape=[7, 7], pads=[3, 3, 3, 3], strides=[2, 2]), False, 1),
    ("Conv", [[2, 4, 8, 8], [8, 4, 3, 3]], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), True, 4),
    ("Conv", [[2, 8, 8, 8], [8, 8, 3, 3]], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), True, 1),
    ("Conv", [[2, 8, 8, 8], [16, 8, 1, 1], [16]], dict(kernel_shape=[1, 1]), True, 2),
    ("Conv", [[2, 8, 8, 8], [8, 1, 3, 3]], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=8), True, 3),
    ("Conv", [[2, 8, 8, 8], [8, 1, 5, 5]], dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[2, 2], group=8),
     True, 1),
    ("BatchNormalization", [[2, 8, 8, 8], [8], [8], [8], [8]], dict(epsilon=1e-5, momentum=0.9), True, 5),
    ("Relu", [[2, 8, 8, 8]], {}, True, 4),
    ("MaxPool", [[2, 8, 8, 8]], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), True, 1),
    ("GlobalAveragePool", [[2, 8, 4, 4]], {}, True, 1),
    ("AveragePool", [[2, 8, 8, 8]], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]), True, 1),
)

# The markdown table of instances: (header, the row's JSON fields it shows).
COLUMNS = (
    ("model", ["model"]),
    ("class", ["class"]),
    ("shape (N,C,H,W -> Co, k, stride, group)", ["shape"]),
    ("count in model", ["count"]),
    ("ORT fwd ms", ["ort_fwd_ms"]),
    ("jaxort fwd ms", ["jaxort_fwd_ms"]),
    ("jaxort÷ORT fwd", ["fwd_ratio"]),
    ("ORT bwd ms", ["ort_bwd_ms", "ort_bwd_missing"]),
    ("jaxort bwd ms", ["jaxort_bwd_ms"]),
    ("jaxort÷ORT bwd", ["bwd_ratio"]),
    ("rate: ORT fwd / jaxort fwd / ORT bwd / jaxort bwd",
     ["unit", "rate_ort_fwd", "rate_jaxort_fwd", "rate_ort_bwd", "rate_jaxort_bwd"]),
    ("matmul same FLOPs ms (GFLOP/s)", ["matmul_ms", "matmul_gflops"]),
    ("of matmul's GFLOP/s: ORT fwd / jaxort fwd / ORT bwd / jaxort bwd",
     ["ort_fwd_of_matmul", "jaxort_fwd_of_matmul", "ort_bwd_of_matmul", "jaxort_bwd_of_matmul"]),
    ("max diff fwd / bwd", ["fwd_max_diff", "fwd_ok", "bwd_max_diff", "bwd_ok"]),
)


# -- instances: shapes and attributes ------------------------------------------------------------

def _prod(xs) -> int:
    return math.prod(int(x) for x in xs)


def _attr_values(node) -> dict:
    """A node's attributes as JSON values (strings decoded)."""
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else list(v) if isinstance(v, (list, tuple)) else v
    return out


def _normal_attrs(op: str, attrs: dict, inputs: list) -> dict:
    """The attributes that decide an instance, with the spec's defaults filled in where a kernel needs them."""
    attrs = {k: v for k, v in attrs.items() if not (k == "auto_pad" and v in ("NOTSET", ""))}
    if op == "Conv":
        kernel = list(inputs[1][2:])
        n = len(kernel)
        out = {"kernel_shape": kernel, "strides": [1] * n, "dilations": [1] * n, "group": 1}
        if "auto_pad" not in attrs:
            out["pads"] = [0] * (2 * n)
        out.update(attrs)
        return out
    if op == "BatchNormalization":
        # training_mode is dropped: every instance is timed as a training step runs it.
        return {"epsilon": float(attrs.get("epsilon", 1e-5)), "momentum": float(attrs.get("momentum", 0.9))}
    return attrs


def _conv_class(inst: dict) -> str:
    x, attrs = inst["inputs"][0], inst["attrs"]
    kernel, group = attrs["kernel_shape"], attrs["group"]
    square = "x".join(str(k) for k in kernel)
    if group > 1:
        return f"depthwise {square}" if group == x[1] else "grouped"
    if not inst["needs_dx"] or max(kernel) > 3:
        return "stem/kxk"
    if max(kernel) == 1:
        return "pointwise 1x1"
    if all(k == 3 for k in kernel):
        return f"3x3 s{max(attrs['strides'])}"
    return "other conv"


def conv_flops(x, w, y, group: int) -> int:
    """Forward FLOPs of a Conv: 2 N Co (Ci/group) prod(kernel) prod(output spatial)."""
    return 2 * y[0] * y[1] * (x[1] // group) * _prod(w[2:]) * _prod(y[2:])


def _work(inst: dict) -> dict:
    """FLOPs (Conv) or float32 bytes read and written (the rest), forward and backward."""
    out = {"flops_fwd": None, "flops_bwd": None, "bytes_fwd": None, "bytes_bwd": None}
    if inst["op"] == "Conv":
        f = conv_flops(inst["inputs"][0], inst["inputs"][1], inst["outputs"][0], inst["attrs"]["group"])
        return dict(out, flops_fwd=f, flops_bwd=f * (2 if inst["needs_dx"] else 1), unit="GFLOP/s")
    x, y = _prod(inst["inputs"][0]), _prod(inst["outputs"][0])
    # BatchNormalization's and Relu's gradients also read X (or Y, the same size).
    reads = x if inst["op"] in ("BatchNormalization", "Relu") else 0
    return dict(out, bytes_fwd=4 * (x + y), bytes_bwd=4 * (y + reads + x), unit="GB/s")


def _work_fwd(inst: dict) -> int:
    return inst["flops_fwd"] if inst["flops_fwd"] is not None else inst["bytes_fwd"]


def make_instance(model: str, op: str, inputs: list, attrs: dict, needs_dx: bool, count: int) -> dict:
    """An op instance: its shapes (outputs inferred by onnx), class and work.

    Args:
      model: the model it comes from (S1-S3, or "smoke").
      op: the ONNX op type.
      inputs: the input shapes, in the op's input order.
      attrs: the node's attributes.
      needs_dx: whether the data input needs a gradient (not for the first Conv).
      count: how many nodes of the model it stands for.

    Returns:
      A JSON-able dict.
    """
    import onnx

    inst = {"model": model, "op": op, "inputs": [list(map(int, s)) for s in inputs],
            "attrs": _normal_attrs(op, attrs, inputs), "needs_dx": bool(needs_dx), "count": int(count)}
    inferred = onnx.shape_inference.infer_shapes(forward_model(inst, shaped=False), strict_mode=True)
    inst["outputs"] = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in inferred.graph.output]
    inst["class"] = _conv_class(inst) if op == "Conv" else op
    inst.update(_work(inst))
    return inst


def _value_shapes(graph) -> dict:
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    return shapes


def collect(name: str, path: str) -> list:
    """The distinct instances of ``OPS`` in the model at ``path``, each with its count."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    shapes = _value_shapes(model.graph)
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input} - initializers
    counts, nodes = {}, {}
    for node in model.graph.node:
        if node.op_type not in OPS or node.domain not in ("", "ai.onnx"):
            continue
        inputs = [shapes.get(i) for i in node.input if i]
        if any(s is None for s in inputs):
            print(f"  {name} {node.name}: shapes unknown, left out", file=sys.stderr)
            continue
        needs_dx = not (node.op_type == "Conv" and node.input[0] in graph_inputs)
        attrs = _normal_attrs(node.op_type, _attr_values(node), inputs)
        key = json.dumps([node.op_type, inputs, attrs, needs_dx], sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
        nodes[key] = (node.op_type, inputs, attrs, needs_dx)
    return [make_instance(name, *nodes[k], counts[k]) for k in counts]


def select(instances: list, top: int) -> list:
    """Per class, the ``top`` instances with the most forward work x count."""
    by_class = {}
    for inst in instances:
        by_class.setdefault(inst["class"], []).append(inst)
    kept = []
    for group in by_class.values():
        kept += sorted(group, key=lambda i: _work_fwd(i) * i["count"], reverse=True)[:top]
    return kept


def class_totals(instances: list, kept: list) -> dict:
    """Per class: distinct instances, nodes, work x count, and the share of it the kept instances hold."""
    ids = {id(i) for i in kept}
    out = {}
    for inst in instances:
        t = out.setdefault(inst["class"], {"distinct": 0, "nodes": 0, "timed": 0, "work": 0, "timed_work": 0})
        w = _work_fwd(inst) * inst["count"]
        t["distinct"] += 1
        t["nodes"] += inst["count"]
        t["work"] += w
        if id(inst) in ids:
            t["timed"] += 1
            t["timed_work"] += w
    for t in out.values():
        t["coverage"] = t["timed_work"] / t["work"] if t["work"] else 1.0
    return out


def describe(inst: dict) -> str:
    """The shape column: N x C x H x W, and for Conv -> Co, kernel, stride, group."""
    x = "x".join(str(d) for d in inst["inputs"][0])
    a = inst["attrs"]
    if inst["op"] == "Conv":
        k = "x".join(str(d) for d in a["kernel_shape"])
        s = "x".join(str(d) for d in a["strides"]) if len(set(a["strides"])) > 1 else a["strides"][0]
        extra = (" +bias" if len(inst["inputs"]) > 2 else "") + ("" if inst["needs_dx"] else " (no dX)")
        return f"{x} -> {inst['inputs'][1][0]}, k{k}, s{s}, g{a['group']}{extra}"
    if "kernel_shape" in a:
        ceil = ", ceil" if a.get("ceil_mode") else ""
        return f"{x}, k{'x'.join(str(d) for d in a['kernel_shape'])}, s{max(a.get('strides', [1]))}{ceil}"
    return x


# -- one-node models ------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, initializers=(), microsoft=False):
    """A model of ``nodes``; inputs and outputs are (name, shape or None, "float32" or "int64")."""
    from onnx import TensorProto, helper

    def info(name, shape, dtype="float32"):
        return helper.make_tensor_value_info(
            name, TensorProto.INT64 if dtype == "int64" else TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "op", [info(*i) for i in inputs], [info(*o) for o in outputs],
                              initializer=list(initializers))
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid(MS, 1)] if microsoft else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8  # ORT 1.19.2 reads IR <= 10; onnx 1.23 writes a newer one by default
    return model


def _input_names(inst: dict) -> tuple:
    return INPUT_NAMES.get(inst["op"], ("X",))[:len(inst["inputs"])]


def _grad_names(inst: dict) -> tuple:
    """The inputs ORT's gradient kernel differentiates (and jaxort's pullback too)."""
    names = _input_names(inst)
    if inst["op"] == "BatchNormalization":
        return names[:3]
    if inst["op"] == "Conv":
        return names if inst["needs_dx"] else names[1:]
    return names


def forward_model(inst: dict, shaped: bool = True):
    """The instance's op as a one-node standard ONNX model (jaxort's forward, and ORT's for most ops)."""
    from onnx import helper

    names = _input_names(inst)
    outs = OUTPUT_NAMES[:3 if inst["op"] == "BatchNormalization" else 1]
    attrs = dict(inst["attrs"], training_mode=1) if inst["op"] == "BatchNormalization" else inst["attrs"]
    shapes = inst["outputs"] if shaped else [None] * len(outs)
    return _model([helper.make_node(inst["op"], list(names), list(outs), **attrs)],
                  [(n, s) for n, s in zip(names, inst["inputs"])], list(zip(outs, shapes)))


def ort_forward_models(inst: dict) -> list:
    """(label, model) candidates for ORT's forward, the training graph's form first."""
    from onnx import helper

    names, op = list(_input_names(inst)), inst["op"]
    x, y = inst["inputs"][0], inst["outputs"][0]
    if op == "BatchNormalization":
        c = [x[1]]
        outs = list(OUTPUT_NAMES) + ["saved_mean", "saved_inv_std"]
        node = helper.make_node("BatchNormInternal", names, outs, domain=MS, training_mode=1, **inst["attrs"])
        internal = _model([node], list(zip(names, inst["inputs"])), [("Y", y)] + [(o, c) for o in outs[1:]],
                          microsoft=True)
        return [(f"{MS}::BatchNormInternal", internal), ("BatchNormalization training_mode=1", forward_model(inst))]
    if op == "MaxPool":
        node = helper.make_node("MaxPool", ["X"], ["Y", "Indices"], **inst["attrs"])
        return [("MaxPool with Indices", _model([node], [("X", x)], [("Y", y), ("Indices", y, "int64")]))]
    return [(op, forward_model(inst))]


def _conv_grad_model(inst: dict):
    from onnx import helper

    names, shapes = _input_names(inst), dict(zip(_input_names(inst), inst["inputs"]))
    wanted = set(_grad_names(inst))
    outs = [f"grad_{n}" if n in wanted else "" for n in names]
    node = helper.make_node("ConvGrad", ["dY", "X", "W"], outs, domain=MS, **inst["attrs"])
    inputs = [("dY", inst["outputs"][0]), ("X", shapes["X"]), ("W", shapes["W"])]
    return _model([node], inputs, [(o, shapes[o[5:]]) for o in outs if o], microsoft=True)


def _gap_grad_model(inst: dict):
    """GlobalAveragePool's gradient as ORT 1.19.2's gradient builder writes it: Shape, Scale, Expand."""
    from onnx import helper, numpy_helper
    import numpy as np

    x, y = inst["inputs"][0], inst["outputs"][0]
    area = numpy_helper.from_array(np.array(_prod(x[2:]), np.float32), "area")
    nodes = [helper.make_node("Shape", ["X"], ["x_shape"]),
             helper.make_node("Scale", ["dY", "area"], ["scaled_dY"], domain=MS, scale_down=1),
             helper.make_node("Expand", ["scaled_dY", "x_shape"], ["grad_X"])]
    return _model(nodes, [("dY", y), ("X", x)], [("grad_X", x)], [area], microsoft=True)


def ort_backward_model(inst: dict):
    """(label, model) of ORT's gradient kernel for the instance; its outputs are grad_<input name>."""
    from onnx import helper

    op, x, y = inst["op"], inst["inputs"][0], inst["outputs"][0]
    if op == "Conv":
        return f"{MS}::ConvGrad", _conv_grad_model(inst)
    if op == "BatchNormalization":
        c = [x[1]]
        node = helper.make_node("BatchNormalizationGrad", ["dY", "X", "scale", "saved_mean", "saved_inv_std"],
                                ["grad_X", "grad_scale", "grad_B"], domain=MS, epsilon=inst["attrs"]["epsilon"])
        inputs = [("dY", y), ("X", x), ("scale", c), ("saved_mean", c), ("saved_inv_std", c)]
        return f"{MS}::BatchNormalizationGrad", _model([node], inputs, [("grad_X", x), ("grad_scale", c),
                                                                       ("grad_B", c)], microsoft=True)
    if op == "Relu":
        node = helper.make_node("ReluGrad", ["dY", "Y"], ["grad_X"], domain=MS)
        return f"{MS}::ReluGrad", _model([node], [("dY", y), ("Y", y)], [("grad_X", x)], microsoft=True)
    if op == "GlobalAveragePool":
        return f"Shape + {MS}::Scale + Expand", _gap_grad_model(inst)
    # ORT sizes the pooling gradients' dX from the output's declared shape (a
    # model without one crashes ORT 1.19.2), so the output is always shaped.
    if op == "MaxPool":
        node = helper.make_node("MaxPoolGrad", ["dY", "Indices"], ["grad_X"], **inst["attrs"])
        return "MaxPoolGrad", _model([node], [("dY", y), ("Indices", y, "int64")], [("grad_X", x)])
    node = helper.make_node("AveragePoolGrad", ["dY"], ["grad_X"], **inst["attrs"])
    return "AveragePoolGrad", _model([node], [("dY", y)], [("grad_X", x)])


# -- data and systems (in the worker) ---------------------------------------------------------------

def make_data(inst: dict) -> dict:
    """float32 inputs by name and the cotangent ``dY``, from a fixed seed.

    Weights are scaled by 1/sqrt(fan-in) so that a Conv's output stays near 1
    whatever its size: the tolerances then mean the same for every instance.
    """
    import numpy as np

    rng = np.random.default_rng(SEED)
    out = {}
    for name, shape in zip(_input_names(inst), inst["inputs"]):
        z = rng.standard_normal(shape, dtype=np.float32)
        if name == "W":
            z /= np.float32(math.sqrt(_prod(shape[1:])))
        elif name in ("B", "input_mean"):
            z *= np.float32(0.1)
        elif name == "scale":
            z = np.float32(1) + np.float32(0.1) * z
        elif name == "input_var":
            z = np.float32(1) + np.float32(0.1) * np.abs(z)
        out[name] = z
    out["dY"] = rng.standard_normal(inst["outputs"][0], dtype=np.float32)
    return out


def _ort_session(ort, model, pinned: bool):
    """(session, None), or (None, why): "no ORT kernel" when the installed onnxruntime lacks an op."""
    options = ort.SessionOptions()
    if pinned:
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]), None
    except Exception as exc:  # ORT raises its own exception types, one per status code
        text = str(exc)
        if "not a registered function/op" in text or "No Op registered" in text:
            return None, NO_KERNEL
        return None, "ORT error: " + text.strip().splitlines()[0][:200]


def _ort_run(session, pool: dict):
    """A callable running ``session`` on the arrays of ``pool`` it reads, and its outputs by name."""
    feeds = {i.name: pool[i.name] for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds)))
    return (lambda: session.run(None, feeds)), outputs


def ort_systems(inst: dict, data: dict, ort, pinned: bool) -> dict:
    """ORT's forward and backward: callables, outputs, the ORT op used, or why there is none."""
    out = {"fwd": None, "bwd": None, "fwd_out": None, "bwd_out": None, "fwd_op": None, "bwd_op": None,
           "fwd_missing": None, "bwd_missing": None}
    if ort is None:
        return dict(out, fwd_missing="onnxruntime not importable", bwd_missing="onnxruntime not importable")
    reasons = []
    for label, model in ort_forward_models(inst):
        session, why = _ort_session(ort, model, pinned)
        if session is None:
            reasons.append(f"{why} ({label})")
            continue
        out["fwd"], out["fwd_out"] = _ort_run(session, data)
        out["fwd_op"] = label
        break
    else:
        return dict(out, fwd_missing="; ".join(reasons), bwd_missing="no ORT forward")
    label, model = ort_backward_model(inst)
    session, why = _ort_session(ort, model, pinned)
    if session is None:
        return dict(out, bwd_missing=f"{why} ({label})")
    pool = dict(data, **out["fwd_out"])  # Indices, Y, saved mean and inverse std from ORT's forward
    lacking = [i.name for i in session.get_inputs() if i.name not in pool]
    if lacking:
        return dict(out, bwd_missing=f"ORT's forward ({out['fwd_op']}) gives no {lacking} ({label})")
    out["bwd"], out["bwd_out"] = _ort_run(session, pool)
    out["bwd_op"] = label
    return out


def jaxort_systems(inst: dict, data: dict) -> dict:
    """jaxort's jitted forward and backward (the pullback on the forward's residuals), with their values."""
    import jax
    import numpy as np

    from jaxort.graph import JaxGraph, lowering_platform

    graph = JaxGraph(forward_model(inst))
    names = graph.input_names
    args = tuple(jax.device_put(data[n]) for n in names)
    wrt = [names.index(n) for n in _grad_names(inst)]
    rest = [i for i in range(len(names)) if i not in wrt]

    def forward(*a):
        return graph.apply({}, *a, training=True)

    def first_output(fixed, moving):
        full = dict(zip(rest, fixed)) | dict(zip(wrt, moving))
        return forward(*(full[i] for i in range(len(names))))[0]

    def forward_and_pullback(fixed, moving):
        return jax.vjp(lambda *m: first_output(fixed, m), *moving)

    fixed, moving = tuple(args[i] for i in rest), tuple(args[i] for i in wrt)
    ct = jax.device_put(data["dY"])
    start = time.perf_counter()
    # Traced for CPU, as jaxort's compiled steps trace for the platform they run on.
    with lowering_platform("cpu"):
        fwd = jax.jit(forward).lower(*args).compile()
        compiled_fwd = time.perf_counter()
        _, pullback = jax.jit(forward_and_pullback).lower(fixed, moving).compile()(fixed, moving)
        bwd = jax.jit(lambda p, c: p(c)).lower(pullback, ct).compile()
    compile_s = {"fwd": compiled_fwd - start, "bwd": time.perf_counter() - compiled_fwd}
    grads = dict(zip(_grad_names(inst), (np.asarray(g) for g in bwd(pullback, ct))))
    return {"fwd": lambda: jax.block_until_ready(fwd(*args)),
            "bwd": lambda: jax.block_until_ready(bwd(pullback, ct)),
            "fwd_out": [np.asarray(o) for o in fwd(*args)], "grads": grads, "compile_s": compile_s}


def matmul_system(flops: int):
    """A jitted float32 d x d by d x d ``jnp.dot`` with 2 d^3 closest to ``flops``; returns (callable, its FLOPs)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    d = max(1, round((flops / 2) ** (1 / 3)))
    rng = np.random.default_rng(SEED)
    a, b = (jax.device_put(rng.standard_normal((d, d), dtype=np.float32)) for _ in range(2))
    mm = jax.jit(jnp.dot).lower(a, b).compile()
    return (lambda: mm(a, b).block_until_ready()), 2 * d ** 3


# -- checks ------------------------------------------------------------------------------------------

def compare(got: list, want: list, tol: float) -> dict:
    """Max abs difference and whether every value is within tol x (max(1, max |want|) + |want|)."""
    import numpy as np

    worst, ok = 0.0, len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return {"max_diff": None, "ok": False, "note": f"shape {list(g.shape)} vs {list(w.shape)}"}
        if not g.size:
            continue
        err = np.abs(g - w)
        scale = max(1.0, float(np.max(np.abs(w))))
        ok = ok and bool(np.all(err <= tol * (scale + np.abs(w))))
        worst = max(worst, float(np.max(err)))
    return {"max_diff": worst, "ok": ok}


def reference_forward(inst: dict, data: dict) -> list:
    """The forward of ``onnx.reference`` (numpy) on the same one-node model."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(forward_model(inst)).run(None, {n: data[n] for n in _input_names(inst)})


def checks(inst: dict, data: dict, ort: dict, jx: dict, smoke: bool) -> dict:
    """jaxort against ORT (forward, and backward where ORT has the kernel), and against numpy in smoke mode."""
    n = len(jx["fwd_out"])
    out = {"fwd_reference": None, "fwd_max_diff": None, "fwd_ok": None, "fwd_numpy_max_diff": None,
           "fwd_numpy_ok": None, "bwd_max_diff": None, "bwd_ok": None}
    if ort["fwd_out"] is not None:
        c = compare(jx["fwd_out"], list(ort["fwd_out"].values())[:n], FWD_TOL)
        out.update(fwd_reference="ORT", fwd_max_diff=c["max_diff"], fwd_ok=c["ok"])
    if smoke or ort["fwd_out"] is None:
        c = compare(jx["fwd_out"], reference_forward(inst, data), FWD_TOL)
        out.update(fwd_numpy_max_diff=c["max_diff"], fwd_numpy_ok=c["ok"])
        if ort["fwd_out"] is None:
            out.update(fwd_reference="onnx.reference", fwd_max_diff=c["max_diff"], fwd_ok=c["ok"])
    if ort["bwd_out"] is not None:
        names = list(jx["grads"])
        c = compare([jx["grads"][k] for k in names], [ort["bwd_out"][f"grad_{k}"] for k in names], BWD_TOL)
        out.update(bwd_max_diff=c["max_diff"], bwd_ok=c["ok"])
    return out


# -- timing ------------------------------------------------------------------------------------------

def time_interleaved(fns: dict, rounds: int, min_sample_s: float):
    """Seconds per call of each callable, one sample per round, in an order rotated round by round.

    A sample repeats a callable until it has run for about ``min_sample_s``
    (the count fixed before the rounds): a call of a few microseconds is
    otherwise lost in the clock's and the loop's overhead.

    Returns:
      (name -> list of seconds per call, name -> repetitions per sample).
    """
    reps = {}
    for name, fn in fns.items():
        fn()  # a warm-up call: what a second call still sets up stays out of the rounds
        start = time.perf_counter()
        fn()
        once = time.perf_counter() - start
        reps[name] = max(1, min(MAX_REPS, math.ceil(min_sample_s / max(once, 1e-7))))
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn, m = fns[name], reps[name]
            start = time.perf_counter()
            for _ in range(m):
                fn()
            times[name].append((time.perf_counter() - start) / m)
    return times, reps


def summary(values):
    """median, min, max and n of ``values`` (None when empty)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _rates(row: dict, ms: dict, mm_flops) -> dict:
    """GFLOP/s or GB/s of each system, and the Conv's as a fraction of the same-FLOPs matmul's."""
    out = {}
    for system in ("ort_fwd", "jaxort_fwd", "ort_bwd", "jaxort_bwd"):
        phase = system.split("_")[1]
        work = row[f"flops_{phase}"] if row["flops_fwd"] is not None else row[f"bytes_{phase}"]
        t = ms.get(system)
        out[f"rate_{system}"] = work / (t * 1e-3) / 1e9 if t else None
    mm = ms.get("matmul")
    gflops = mm_flops / (mm * 1e-3) / 1e9 if mm else None
    out["matmul_gflops"] = gflops
    out["matmul_ms"] = row["flops_fwd"] / (gflops * 1e9) * 1e3 if gflops else None
    for system in ("ort_fwd", "jaxort_fwd", "ort_bwd", "jaxort_bwd"):
        rate = out[f"rate_{system}"]
        out[f"{system}_of_matmul"] = rate / gflops if gflops and rate is not None else None
    return out


def measure(inst: dict, ort, settings) -> dict:
    """Builds, checks and times every system on one instance; returns its row."""
    data = make_data(inst)
    o = ort_systems(inst, data, ort, settings.pinned)
    jx = jaxort_systems(inst, data)
    fns = {"ort_fwd": o["fwd"], "jaxort_fwd": jx["fwd"], "ort_bwd": o["bwd"], "jaxort_bwd": jx["bwd"]}
    mm_flops = None
    if inst["flops_fwd"] is not None:
        fns["matmul"], mm_flops = matmul_system(inst["flops_fwd"])
    row = dict(inst, shape=describe(inst), **checks(inst, data, o, jx, settings.smoke))
    times, reps = time_interleaved({k: f for k, f in fns.items() if f is not None}, settings.rounds,
                                   settings.min_sample_s)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    row.update({f"{s}_ms": ms.get(s) for s in ("ort_fwd", "jaxort_fwd", "ort_bwd", "jaxort_bwd")})
    for phase in ("fwd", "bwd"):
        pair = times.get(f"ort_{phase}"), times.get(f"jaxort_{phase}")
        # Speed ratio jaxort/ORT, round by round: ORT's time over jaxort's (above 1: jaxort is faster).
        row[f"{phase}_ratio"] = summary([a / b for a, b in zip(*pair)]) if all(pair) else None
        row[f"ort_{phase}_op"], row[f"ort_{phase}_missing"] = o[f"{phase}_op"], o[f"{phase}_missing"]
    row.update(_rates(row, ms, mm_flops))
    row.update(rounds_ms={k: [t * 1e3 for t in v] for k, v in times.items()}, reps=reps,
               matmul_flops=mm_flops, compile_s=jx["compile_s"], error=None)
    return row


def _failed_row(inst: dict, exc: Exception) -> dict:
    """The row of an instance whose systems could not be built or run: its fields, empty, and the error."""
    row = dict(inst, shape=describe(inst), error=f"{type(exc).__name__}: {str(exc).strip()[:300]}")
    for _, keys in COLUMNS:
        for key in keys:
            row.setdefault(key, None)
    return row


class Settings:
    """What a worker needs besides its instances."""

    def __init__(self, rounds: int, min_sample_s: float, pinned: bool, smoke: bool):
        self.rounds, self.min_sample_s, self.pinned, self.smoke = rounds, min_sample_s, pinned, smoke


def call_overheads(ort, settings: Settings) -> dict:
    """Microseconds per call of a one-element program: jax's dispatch, and ORT's session.run.

    Each op here is a program of its own, so the smallest pay this on every
    call; a train step pays it once for every op together.
    """
    import jax
    import numpy as np
    from onnx import helper

    x = np.ones([1], np.float32)
    add = jax.jit(lambda v: v + 1).lower(x).compile()
    dx = jax.device_put(x)
    fns = {"jax": lambda: add(dx).block_until_ready()}
    if ort is not None:
        model = _model([helper.make_node("Relu", ["X"], ["Y"])], [("X", [1])], [("Y", [1])])
        session, _ = _ort_session(ort, model, settings.pinned)
        if session is not None:
            fns["ort"] = _ort_run(session, {"X": x})[0]
    times, _ = time_interleaved(fns, max(settings.rounds, 3), settings.min_sample_s)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def run_worker(instances: list, settings: Settings) -> dict:
    """Times every instance in this process (pinned, if so, before jax and onnxruntime are imported)."""
    try:
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
    except ImportError:
        ort = None
    rows, start = [], time.perf_counter()
    for inst in instances:
        try:
            row = measure(inst, ort, settings)
        except Exception as exc:  # one instance's failure is reported in its row, not fatal to the run
            row = _failed_row(inst, exc)
        rows.append(row)
        print(f"  {inst['model']} {inst['class']:>18} {row['shape']:<44} "
              f"ORT {_num(row['ort_fwd_ms'])} / {_num(row['ort_bwd_ms'])} ms, "
              f"jaxort {_num(row['jaxort_fwd_ms'])} / {_num(row['jaxort_bwd_ms'])} ms"
              + (f"  {row['error']}" if row["error"] else ""), file=sys.stderr, flush=True)
    return {"rows": rows, "onnxruntime": getattr(ort, "__version__", None),
            "call_overhead_us": call_overheads(ort, settings), "wall_s": time.perf_counter() - start}


# -- orchestration --------------------------------------------------------------------------------------

def _run_subprocess(instances: list, threads: str, args, folder: str) -> dict:
    """One model x thread setting in its own process; returns what it measured."""
    tag = f"{instances[0]['model']}-{threads}"
    src, dst = os.path.join(folder, f"{tag}.in.json"), os.path.join(folder, f"{tag}.out.json")
    with open(src, "w") as f:
        json.dump(instances, f)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", src, "--result", dst,
           "--rounds", str(args.rounds), "--min-sample-ms", str(args.min_sample_ms)]
    cmd += (["--pin"] if threads == "pinned" else []) + (["--smoke"] if args.smoke else [])
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["JAXORT_COMPILATION_CACHE"] = "off"  # no compiled program read from, or left on, the disk
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, timeout=args.timeout)
    with open(dst) as f:
        result = json.load(f)
    result.update(model=instances[0]["model"], threads=threads, subprocess_s=time.perf_counter() - start)
    return result


def _instances(args) -> tuple:
    """(model -> instances to time, model -> description and class totals)."""
    if args.smoke:
        every = [make_instance("smoke", *spec) for spec in SMOKE]
        return {"smoke": every}, {"smoke": {"description": "tiny synthetic ops", "classes": class_totals(every, every)}}
    timed, models = {}, {}
    for name in args.models.split(","):
        folder = os.path.join(args.cache, name)
        path = os.path.join(folder, "model.onnx")
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: run `python benchmarks/scale.py export --models {name}` first")
        every = collect(name, path)
        timed[name] = select(every, args.top)
        try:
            with open(os.path.join(folder, "config.json")) as f:
                description = json.load(f).get("description", name)
        except (OSError, ValueError):
            description = name
        models[name] = {"description": description, "classes": class_totals(every, timed[name])}
        print(f"== {name} {description}: {len(every)} distinct instances, {len(timed[name])} timed",
              file=sys.stderr, flush=True)
    return timed, models


def versions() -> dict:
    """The installed versions of the packages whose speed or numbers the report depends on."""
    import importlib.metadata as md

    out = {}
    for pkg in ("jax", "jaxlib", "onnxruntime", "onnxruntime-training", "onnx", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _command(argv) -> str:
    """The command line, paths inside the repository relative to it."""
    words = [os.path.relpath(a, ROOT) if os.path.isabs(a) and a.startswith(ROOT + os.sep) else a for a in argv]
    return " ".join(["python", "benchmarks/ops_vs_ort.py"] + words)


# -- report ------------------------------------------------------------------------------------------------

def class_summary(rows: list, models: dict) -> list:
    """Per model and class, and per model over all classes: the sum over timed instances of count x ms."""
    keys = ("ort_fwd_ms", "jaxort_fwd_ms", "ort_bwd_ms", "jaxort_bwd_ms")
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        for cls in list(dict.fromkeys(r["class"] for r in mine)) + [None]:
            group = [r for r in mine if cls is None or r["class"] == cls]
            totals = models[model]["classes"]
            line = {"model": model, "class": cls or "all classes", "timed": len(group),
                    "distinct": sum(t["distinct"] for c, t in totals.items() if cls in (None, c)),
                    "nodes": sum(t["nodes"] for c, t in totals.items() if cls in (None, c)),
                    "coverage": totals[cls]["coverage"] if cls else None}
            for k in keys:
                # A sum with an instance missing would compare unlike totals: left empty instead.
                vals = [r[k] for r in group]
                line[k] = sum(r["count"] * v for r, v in zip(group, vals)) if None not in vals else None
            out.append(_with_ratios(line))
        classes = [s for s in out if s["model"] == model and s["coverage"] is not None]
        if any(s["coverage"] < 1 for s in classes):
            # Each class's instances left out assumed as fast per unit of work as its timed ones.
            scaled = {"model": model, "class": "all classes, each ÷ its coverage", "timed": None,
                      "distinct": None, "nodes": None, "coverage": None}
            for k in keys:
                vals = [s[k] / s["coverage"] if s[k] is not None and s["coverage"] else None for s in classes]
                scaled[k] = sum(vals) if None not in vals else None
            out.append(_with_ratios(scaled))
    return out


def _with_ratios(line: dict) -> dict:
    """``line`` with the speed ratios of its sums (ORT's ms over jaxort's)."""
    for phase in ("fwd", "bwd"):
        o, j = line[f"ort_{phase}_ms"], line[f"jaxort_{phase}_ms"]
        line[f"{phase}_ratio"] = o / j if o and j else None
    return line


def _num(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _diff(value, ok) -> str:
    return "—" if value is None and ok is None else f"{_num(value)}{'' if ok else ' ✗'}"


def _cells(row: dict) -> list:
    """The row's cells, in ``COLUMNS`` order."""
    ratio = {p: _num(row[f"{p}_ratio"]["median"]) if row[f"{p}_ratio"] else "—" for p in ("fwd", "bwd")}
    missing = row["ort_bwd_missing"] or ""
    ort_bwd = _num(row["ort_bwd_ms"]) if row["ort_bwd_ms"] is not None else (
        NO_KERNEL if missing.startswith(NO_KERNEL) else missing[:60] or "—")
    rates = " / ".join(_num(row[f"rate_{s}"]) for s in ("ort_fwd", "jaxort_fwd", "ort_bwd", "jaxort_bwd"))
    matmul = f"{_num(row['matmul_ms'])} ({_num(row['matmul_gflops'])})" if row["matmul_ms"] else "—"
    of_mm = " / ".join(_pct(row[f"{s}_of_matmul"]) for s in ("ort_fwd", "jaxort_fwd", "ort_bwd", "jaxort_bwd"))
    shape = row["shape"] + (" **error**" if row.get("error") else "")
    return [row["model"], row["class"], shape, str(row["count"]), _num(row["ort_fwd_ms"]),
            _num(row["jaxort_fwd_ms"]), ratio["fwd"], ort_bwd, _num(row["jaxort_bwd_ms"]), ratio["bwd"],
            f"{rates} {row.get('unit') or ''}".strip(), matmul, of_mm if row["matmul_ms"] else "—",
            f"{_diff(row['fwd_max_diff'], row['fwd_ok'])} / {_diff(row['bwd_max_diff'], row['bwd_ok'])}"]


def _summary_table(lines_in: list) -> list:
    lines = ["| model | class | instances timed / distinct (nodes) | coverage of class work | ORT fwd ms | "
             "jaxort fwd ms | jaxort÷ORT fwd | ORT bwd ms | jaxort bwd ms | jaxort÷ORT bwd |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in lines_in:
        counts = "" if s["timed"] is None else f"{s['timed']} / {s['distinct']} ({s['nodes']})"
        lines.append(f"| {s['model']} | {s['class']} | {counts} | "
                     f"{_pct(s['coverage'])} | {_num(s['ort_fwd_ms'])} | {_num(s['jaxort_fwd_ms'])} | "
                     f"{_num(s['fwd_ratio'])} | {_num(s['ort_bwd_ms'])} | {_num(s['jaxort_bwd_ms'])} | "
                     f"{_num(s['bwd_ratio'])} |")
    return lines


def _notes(rows: list) -> list:
    """Which ORT op each row's figures come from where it is not the op itself, and what is missing or failed."""
    notes = {}
    for r in rows:
        for phase in ("fwd", "bwd"):
            used, missing = r.get(f"ort_{phase}_op"), r.get(f"ort_{phase}_missing")
            if used and used != r["op"]:
                notes.setdefault(f"ORT {phase} of {r['op']}: {used}", None)
            if missing:
                notes.setdefault(f"ORT {phase} of {r['op']}: {missing}", None)
        if r.get("error"):
            notes.setdefault(f"{r['model']} {r['class']} {r['shape']}: {r['error']}", None)
    return [f"- {n}" for n in notes]


def markdown(report: dict) -> str:
    """The report as markdown: command and machine, then per thread setting the instances and the summary."""
    m = report["machine"]
    lines = [f"`{report['command']}`", "",
             f"{m['cpus']} CPUs ({m['cpu']}); " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
             "",
             f"{report['settings']['rounds']} interleaved rounds per instance (order rotated), each sample "
             f"repeating a system for at least {report['settings']['min_sample_ms']} ms; ms are medians over "
             "rounds. jaxort÷ORT is a speed ratio, the median of per-round ORT time / jaxort time (above 1: "
             "jaxort is faster). Rates are GFLOP/s for Conv (backward: dX and dW), GB/s of float32 read and "
             "written for the other ops; matmul: a jitted float32 jnp.dot of about the Conv's forward FLOPs. "
             "Max diff: jaxort against ORT (forward; backward where ORT has the kernel), ✗ past the "
             "tolerance.", ""]
    for config in report["configs"]:
        title = ("default threads" if config["threads"] == "default"
                 else "pinned to one core (ORT one intra- and one inter-op thread)")
        lines += [f"**{title}**", "", "| " + " | ".join(h for h, _ in COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(_cells(r)) + " |" for r in config["rows"]]
        lines += ["", f"Where the step's time goes, {title}: per model and class, the sum over the timed "
                  "instances of count × median ms (coverage: their share of the class's work × count).", ""]
        lines += _summary_table(config["summary"]) + [""]
        overheads = "; ".join(
            f"{w['model']}: " + ", ".join(f"{k} {v:.0f} µs" for k, v in w["call_overhead_us"].items())
            for w in config["workers"])
        lines += [f"Per-call overhead (a one-element program, in each subprocess): {overheads}. Every op above "
                  "is a program of its own and pays it on each call; a train step pays it once.", ""]
        lines += _notes(config["rows"]) + [""]
    lines.append(f"Wall time {report['wall_s']:.0f} s.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """The command line: the orchestrator, or (``--worker``) one model x thread setting."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of S1,S2,S3")
    p.add_argument("--threads", help="comma-separated: default, pinned (default both; --smoke: default)")
    p.add_argument("--cache", default=CACHE, help="where the exported models are (default build/bench-scale)")
    p.add_argument("--top", type=int, default=3, help="instances timed per model and class (default 3)")
    p.add_argument("--rounds", type=int, help="timed rounds per instance (default 5; --smoke: 2)")
    p.add_argument("--min-sample-ms", type=float, help="least time of one sample (default 10; --smoke: 1)")
    p.add_argument("--smoke", action="store_true", help="tiny synthetic ops, 2 rounds, default threads only")
    p.add_argument("--out", help="where ops_vs_ort.json and .md go (default benchmarks/results; --smoke: a temp dir)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per subprocess")
    p.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pin:  # before jax or onnxruntime is imported
        os.sched_setaffinity(0, {0})
    args.rounds = args.rounds or (2 if args.smoke else 5)
    args.min_sample_ms = args.min_sample_ms if args.min_sample_ms is not None else (1.0 if args.smoke else 10.0)
    if args.worker:
        with open(args.worker) as f:
            instances = json.load(f)
        result = run_worker(instances, Settings(args.rounds, args.min_sample_ms / 1e3, args.pin, args.smoke))
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0
    threads = args.threads.split(",") if args.threads else ["default"] if args.smoke else list(THREADS)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown or not set(threads) <= set(THREADS):
        p.error(f"models are {', '.join(MODELS)}; threads {', '.join(THREADS)}")
    return _orchestrate(args, argv, threads)


def _orchestrate(args, argv, threads) -> int:
    """Collects the instances, runs one subprocess per model x thread setting, writes the report."""
    wall = time.perf_counter()
    args.cache = os.path.abspath(args.cache)
    timed, models = _instances(args)
    report = {"command": _command(argv), "smoke": args.smoke, "columns": [list(c) for c in COLUMNS],
              "settings": {"rounds": args.rounds, "min_sample_ms": args.min_sample_ms, "top": args.top,
                           "fwd_tol": FWD_TOL, "bwd_tol": BWD_TOL, "opset": OPSET, "seed": SEED},
              "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model(), "versions": versions()},
              "models": models, "configs": []}
    with tempfile.TemporaryDirectory(prefix="ops-vs-ort-") as folder:
        for t in threads:
            rows, workers = [], []
            for name, instances in timed.items():
                print(f"== {name} threads={t}: {len(instances)} instances", file=sys.stderr, flush=True)
                result = _run_subprocess(instances, t, args, folder)
                rows += result.pop("rows")
                workers.append(result)
            report["configs"].append({"threads": t, "rows": rows, "workers": workers,
                                      "summary": class_summary(rows, models)})
    report["wall_s"] = time.perf_counter() - wall
    out = args.out or (tempfile.mkdtemp(prefix="ops-vs-ort-smoke-") if args.smoke else os.path.join(HERE, "results"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ops_vs_ort.json"), "w") as f:
        json.dump(report, f, indent=1)
    table = markdown(report)
    with open(os.path.join(out, "ops_vs_ort.md"), "w") as f:
        f.write(table)
    print(table)
    print(f"wrote {os.path.join(out, 'ops_vs_ort.md')} and ops_vs_ort.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
