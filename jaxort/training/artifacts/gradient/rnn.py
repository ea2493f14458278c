"""Gradient rules of LSTM and GRU, and of ORT's LSTMTraining and GRUTraining.

Part of the training layer: it imports onnx and the rules' shared helpers only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from onnx import TensorProto, helper

from jaxort.graph import normalize_domain
from jaxort.training.artifacts.gradient._common import _MS_DOMAIN, _Emitter, _attrs, _error

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


def _rnn_unsupported(em: _Emitter, node, plain_op: str) -> Optional[str]:
    """Why ORT 1.19.2 cannot train this LSTM or GRU with its gradient op, or None."""
    attrs = _attrs(node)
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    names = [a.decode().lower() if isinstance(a, bytes) else a.lower() for a in attrs.get("activations", [])]
    why = None
    if direction != "forward":
        why = f"runs in direction {direction!r}"
    elif names and names != _RNN_ACTIVATIONS[plain_op]:
        why = f"has activations {names}, not the default {_RNN_ACTIVATIONS[plain_op]}"
    elif "clip" in attrs:
        why = "clips its cell inputs"
    elif int(attrs.get("input_forget", 0)):
        why = "couples its input and forget gates (input_forget=1)"
    elif int(attrs.get("layout", 0)):
        why = "has layout=1 (batch first)"
    elif len(node.input) > 4 and node.input[4]:
        why = "takes sequence_lens"
    elif em.shapes.get(node.input[0], (0,))[0] not in (TensorProto.FLOAT, TensorProto.UNDEFINED):
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


#: op type -> rule.
RULES: dict = {"LSTM": _recurrent("LSTM"), "GRU": _recurrent("GRU")}

#: com.microsoft op type -> rule: the training forms the rules above write.
MS_RULES: dict = {"LSTMTraining": _recurrent("LSTM"), "GRUTraining": _recurrent("GRU")}
