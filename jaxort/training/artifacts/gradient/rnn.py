"""Gradient rules of LSTM, GRU and RNN, and of ORT's LSTMTraining and GRUTraining.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import onnx
from onnx import TensorProto, helper

from jaxort.graph import normalize_domain
from jaxort.training.artifacts.gradient._common import _MS_DOMAIN, _Emitter, _attrs, _error, _filled, _text

# LSTM and GRU: ORT's training forms and gradient ops. An unrolled backward pass in
# standard ops would be a node group per time step, fixed to one sequence length; ORT's
# LSTMGrad and GRUGrad kernels are in every ORT build, so the rules write what ORT's
# gradient builder writes: the forward node becomes LSTMTraining / GRUTraining (the same
# math, with the all-hidden states, all-cell states and gate values as extra outputs)
# and one LSTMGrad / GRUGrad node reads them.

_RNN_TRAINING = {"LSTM": "LSTMTraining", "GRU": "GRUTraining"}
_RNN_PLAIN = {v: k for k, v in _RNN_TRAINING.items()}
_RNN_STATES = {"LSTM": 3, "GRU": 2}  # Y, Y_h (, Y_c): the outputs of the standard op
_RNN_SAVED = {"LSTM": ("all_cell_states", "iofc"), "GRU": ("zrh",)}
_RNN_ACTIVATIONS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}


def _form_problem(node, activations: Callable[[list], Optional[str]]) -> Optional[str]:
    """What keeps a recurrent node from its rule's form (forward, unclipped, layout 0, no
    sequence_lens; ``activations(names)`` judges its lower-cased activations), or None."""
    attrs = _attrs(node)
    direction = _text(attrs.get("direction", b"forward"))
    if direction != "forward":
        return f"runs in direction {direction!r}"
    why = activations([_text(a).lower() for a in attrs.get("activations", [])])
    if why is not None:
        return why
    if "clip" in attrs:
        return "clips its cell inputs"
    if int(attrs.get("input_forget", 0)):
        return "couples its input and forget gates (input_forget=1)"
    if int(attrs.get("layout", 0)):
        return "has layout=1 (batch first)"
    if len(node.input) > 4 and node.input[4]:
        return "takes sequence_lens"
    return None


def _rnn_unsupported(em: _Emitter, node, plain_op: str) -> Optional[str]:
    """Why ORT 1.19.2 cannot train this LSTM or GRU with its gradient op, or None."""
    default = _RNN_ACTIVATIONS[plain_op]
    why = _form_problem(node, lambda names: None if not names or names == default else
                        f"has activations {names}, not the default {default}")
    if why is None and em.shapes.get(node.input[0], (0,))[0] not in (TensorProto.FLOAT, TensorProto.UNDEFINED):
        why = "is not float32"
    if why is not None:
        return (f"{why}, and ONNX Runtime's {plain_op}Grad kernel only runs the forward, float32, "
                f"default-activation, unclipped form without sequence_lens")
    if plain_op == "LSTM" and len(node.input) > 7 and node.input[7]:
        # Measured in tests/training/test_gradient_graph.py: every gradient off by ~10%.
        return ("has peephole weights, with which ONNX Runtime 1.19.2's LSTMGrad computes wrong "
                "gradients (its forward is right)")
    return None


def _recurrent(plain_op: str) -> Callable:
    def rule(em, node, dys, needs):
        # ORT's LSTMGrad reads X, W, R, sequence_lens, initial_h, initial_c (not B or P);
        # GRUGrad reads X, W, R, B, sequence_lens, initial_h. Both then read the saved
        # values and the gradients of Y and Y_h (and Y_c), and write the gradients of the
        # inputs but sequence_lens, in input order. The kernels always write dW and dR.
        n_states = _RNN_STATES[plain_op]
        if any(d is not None for d in dys[n_states:]):
            raise _error(node, "has its saved cell states or gate values on the path to the loss")
        why = _rnn_unsupported(em, node, plain_op)
        if why is not None:
            raise _error(node, why)
        if normalize_domain(node.domain) == "":
            outputs = list(node.output)[:n_states] + [""] * (n_states - len(node.output))
            outputs[0] = outputs[0] or em.name("all_hidden_states")
            outputs += [em.name(what) for what in _RNN_SAVED[plain_op]]
            del node.output[:]
            node.output.extend(outputs)
            kept = [a for a in node.attribute if a.name != "layout"]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.op_type, node.domain = _RNN_TRAINING[plain_op], _MS_DOMAIN
        elif len(node.output) < n_states + len(_RNN_SAVED[plain_op]) or not node.output[0]:
            raise _error(node, f"lacks the all-hidden-states or saved outputs {plain_op}Grad reads")
        ins = list(node.input) + [""] * 7  # absent optional inputs read as ""
        if plain_op == "LSTM":
            reads = [ins[i] for i in (0, 1, 2, 4, 5, 6)] + [node.output[0], *node.output[3:5]]
        else:
            reads = ins[:6] + [node.output[0], node.output[2]]
        reads += [d or "" for d in dys[:n_states]]
        writes = []
        out = [None] * len(node.input)
        for i, x in enumerate(node.input):
            if i == 4:
                continue
            name = ""
            if x and (needs[i] or i in (1, 2)):
                name = em.name(f"{plain_op}Grad")
                if needs[i]:
                    out[i] = name
            writes.append(name)
        grad = helper.make_node(f"{plain_op}Grad", reads, writes, name=em.name(f"{plain_op}Grad_node"),
                                domain=_MS_DOMAIN)
        grad.attribute.extend(node.attribute)
        em.nodes.append(grad)
        return out
    return rule


# RNN: ORT has no gradient op for it, so the backward pass is a reverse Scan in standard ops
# over the time steps (any sequence length), carrying dH and the weight gradients:
#   dPre_t = (dY_t + dH) * f'(H_t),  dH <- dPre_t R,  dX_t = dPre_t W,
#   dW += dPre_t^T X_t,  dR += dPre_t^T H_{t-1},  dB += sum over the batch of dPre_t (both halves),
# f' read from the output: 1 - H^2 (Tanh), H (1 - H) (Sigmoid), [H > 0] (Relu).
_RNN_DERIVATIVES = {"tanh", "sigmoid", "relu"}


def _rnn(em, node, dys, needs):
    names = [_text(a).lower() for a in _attrs(node).get("activations", [b"Tanh"])]
    why = _form_problem(node, lambda _: None if len(names) == 1 and names[0] in _RNN_DERIVATIVES else
                        f"has activations {names}; the rule takes Tanh, Sigmoid or Relu")
    if why is not None:
        raise _error(node, f"{why}; the RNN rule takes the forward, unclipped form without sequence_lens")
    x, w, r, b, _, initial = list(node.input) + [""] * (6 - len(node.input))
    t = em.elem_type(x)
    outputs = list(node.output) + [""] * (2 - len(node.output))
    outputs[0] = outputs[0] or em.name("all_hidden_states")
    del node.output[:]
    node.output.extend(outputs)
    first, drop = em.ints([0]), em.ints([1])
    hs = em.op("Squeeze", [outputs[0], drop])  # [seq, batch, hidden]
    first_h = em.op("Squeeze", [em.op("Slice", [hs, first, drop, first]), first])  # [batch, hidden]
    def zeros(like):  # in X's dtype, of an emitted value's shape
        return _filled(em, 0.0, x, shape=em.op("Shape", [like]))
    start = em.op("Squeeze", [initial, first]) if initial else zeros(first_h)
    before = em.op("Concat", [em.op("Unsqueeze", [start, first]),
                              em.op("Slice", [hs, first, em.ints([-1]), first])], axis=0)
    g = em.op("Squeeze", [dys[0], drop]) if dys[0] else zeros(hs)
    carry = em.op("Squeeze", [dys[1], first]) if len(dys) > 1 and dys[1] else zeros(first_h)
    w0, r0 = em.op("Squeeze", [w, first]), em.op("Squeeze", [r, first])
    zeros_w, zeros_r = zeros(w0), zeros(r0)
    zeros_b = em.op("ReduceSum", [zeros_r, first], keepdims=0)

    def v(name):
        return helper.make_tensor_value_info(name, t, None)
    body_in = [em.name(n) for n in ("dh", "dw", "dr", "db", "g", "h", "h_before", "x")]
    dh, dw, dr, db, g_t, h_t, hb_t, x_t = body_in
    nodes = []

    def op(op_type, inputs, **kw):
        out = em.name(f"scan/{op_type}")
        nodes.append(helper.make_node(op_type, inputs, [out], name=em.name(f"scan/{op_type}_node"), **kw))
        return out
    one = op("Constant", [], value=helper.make_tensor("one", t, [], [1.0]))
    kind = names[0]
    if kind == "tanh":
        slope = op("Sub", [one, op("Mul", [h_t, h_t])])
    elif kind == "sigmoid":
        slope = op("Mul", [h_t, op("Sub", [one, h_t])])
    else:
        slope = op("Cast", [op("Greater", [h_t, op("Constant", [], value=helper.make_tensor("zero", t, [], [0.0]))])],
                   to=t)
    pre = op("Mul", [op("Add", [g_t, dh]), slope])
    pre_t = op("Transpose", [pre], perm=[1, 0])
    batch_axis = op("Constant", [], value=helper.make_tensor("axis", TensorProto.INT64, [1], [0]))
    body_out = [op("MatMul", [pre, r0]), op("Add", [dw, op("MatMul", [pre_t, x_t])]),
                op("Add", [dr, op("MatMul", [pre_t, hb_t])]),
                op("Add", [db, op("ReduceSum", [pre, batch_axis], keepdims=0)]), op("MatMul", [pre, w0])]
    body = helper.make_graph(nodes, em.name("rnn_backward"), [v(n) for n in body_in], [v(n) for n in body_out])
    d_h, d_w, d_r, d_b, d_x = em.op("Scan", [carry, zeros_w, zeros_r, zeros_b, g, hs, before, x], n_out=5,
                                    body=body, num_scan_inputs=4, scan_input_directions=[1] * 4,
                                    scan_output_directions=[1])
    out = [d_x if needs[0] else None, em.op("Unsqueeze", [d_w, first]) if needs[1] else None,
           em.op("Unsqueeze", [d_r, first]) if needs[2] else None]
    out.append(em.op("Unsqueeze", [em.op("Concat", [d_b, d_b], axis=0), first]) if b and needs[3] else None)
    out.append(None)
    out.append(em.op("Unsqueeze", [d_h, first]) if initial and needs[5] else None)
    return out[:len(node.input)]


#: op type -> rule.
# Inputs per direction, by position: weights, recurrence weights, biases, peepholes (axis 0 of
# [num_directions, ...]) and initial states (the state layout's direction axis).
_PER_DIRECTION = {"LSTM": (1, 2, 3, 7), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}
_STATES_IN = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}
_INT64_MIN = -(2 ** 63)


def split_directions(model: onnx.ModelProto, trainable, opset: int) -> None:
    """Rewrites, in place, each reverse, bidirectional or batch-first (layout=1) LSTM, GRU and
    RNN that a trainable parameter reaches as forward, layout 0 ones, the form the rules (and
    ORT's gradient kernels) take: batch-first inputs and outputs transposed; per direction,
    its slice of the weights, biases and initial states; a reverse direction runs forward over
    the time-reversed input and its Y is reversed back; the directions' outputs are
    concatenated as the node's. The same values; nodes with sequence_lens (whose reversal is
    per sequence) are left to their rule's error."""
    graph = model.graph
    em = _Emitter(model, {}, opset)  # names and nodes only: these rewrites need no shapes
    depends = set(trainable)
    nodes: list = []
    for node in graph.node:
        reached = any(i in depends for i in node.input)
        if reached:
            depends.update(o for o in node.output if o)
        attrs = _attrs(node)
        direction = _text(attrs.get("direction", b"forward"))
        if (not reached or node.op_type not in _PER_DIRECTION or normalize_domain(node.domain) != ""
                or (direction == "forward" and not int(attrs.get("layout", 0)))
                or (len(node.input) > 4 and node.input[4])):
            nodes.append(node)
            continue
        _one_direction_each(em, node, attrs, direction)
        nodes.extend(em.nodes)
        em.nodes = []
    del graph.node[:]
    graph.node.extend(nodes)


def _one_direction_each(em: _Emitter, node, attrs: dict, direction: str) -> None:
    """Emits the nodes that run ``node`` one forward, layout 0 direction at a time (see
    :func:`split_directions`). In layout 0: X [seq, batch, in], Y [seq, dirs, batch, h], the
    states [dirs, batch, h]."""
    layout = int(attrs.get("layout", 0))

    def reversed_in_time(value: str) -> str:  # along axis 0, X's and Y's time axis
        return em.op("Slice", [value, em.ints([-1]), em.ints([_INT64_MIN]), em.ints([0]), em.ints([-1])])

    first = list(node.input)
    if layout:  # batch first: [batch, seq, in] -> [seq, batch, in], [batch, dirs, h] -> [dirs, batch, h]
        for i in (0, *_STATES_IN[node.op_type]):
            if i < len(first) and first[i]:
                first[i] = em.op("Transpose", [first[i]], perm=[1, 0, 2])
    directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
    n_act = len(attrs.get("activations", [])) // len(directions)
    per_direction_outputs = []
    for k, way in enumerate(directions):
        inputs = list(first)
        if len(directions) > 1:  # its slice along the directions axis (0 for weights and states)
            for i in _PER_DIRECTION[node.op_type] + _STATES_IN[node.op_type]:
                if i < len(inputs) and inputs[i]:
                    inputs[i] = em.op("Slice", [inputs[i], em.ints([k]), em.ints([k + 1]), em.ints([0])])
        if way == "reverse":
            inputs[0] = reversed_in_time(inputs[0])
        kept = []
        for a in node.attribute:
            if a.name in ("direction", "layout"):
                continue
            if a.name in ("activations", "activation_alpha", "activation_beta") and len(directions) > 1:
                values = helper.get_attribute_value(a)[k * n_act:(k + 1) * n_act]
                kept.append(helper.make_attribute(a.name, values))
            else:
                kept.append(a)
        outputs = [em.name(f"{node.op_type}_{way}") if o else "" for o in node.output]
        one = helper.make_node(node.op_type, inputs, outputs, name=em.name(f"{node.name or node.op_type}_{way}"))
        one.attribute.extend(kept)
        em.nodes.append(one)
        if way == "reverse" and outputs[0]:
            outputs[0] = reversed_in_time(outputs[0])
        per_direction_outputs.append(outputs)
    for j, name in enumerate(node.output):
        if name:
            parts = [outputs[j] for outputs in per_direction_outputs]
            joined = em.op("Concat", parts, axis=1 if j == 0 else 0) if len(parts) > 1 else parts[0]
            if layout:  # back to batch first: Y [batch, seq, dirs, h], states [batch, dirs, h]
                joined = em.op("Transpose", [joined], perm=[2, 0, 1, 3] if j == 0 else [1, 0, 2])
            em.nodes.append(helper.make_node("Identity", [joined], [name], name=em.name("direction_join")))


RULES: dict = {"LSTM": _recurrent("LSTM"), "GRU": _recurrent("GRU"), "RNN": _rnn}

#: com.microsoft op type -> rule: the training forms the rules above write.
MS_RULES: dict = {"LSTMTraining": _recurrent("LSTM"), "GRUTraining": _recurrent("GRU")}
