"""Checks of the batches a training program takes, made on the host before a compiled step runs.

Done on the values the caller passed rather than inside the jitted step:
there JAX has already converted float64 to float32 and int64 to int32 (its
64-bit mode off), so neither the user's dtype nor a label like 2**40 can be
seen, and a failure after the step would come after the donated state was
consumed. A bad batch leaves the state untouched. Layer: training.
"""

from __future__ import annotations

import threading
from typing import Sequence

import jax
import numpy as np
import onnx

from jaxort.dtypes import to_numpy_dtype
from jaxort.errors import InputError, JaxortError
from jaxort.graph import JaxGraph, check_input, normalize_domain, tensor_to_numpy
from jaxort.training.artifacts import read as ort_artifacts
from jaxort.training.layout import ParameterLayout

__all__ = ["InputChecker", "check_micro_batches"]


def check_micro_batches(micro_batches, inputs, names) -> int:
    """``micro_batches`` checked against the batch: a positive int dividing every batched input."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
        raise InputError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    k = int(micro_batches)
    if k > 1:
        for name, x in zip(names, inputs):
            if np.ndim(x) > 0 and np.shape(x)[0] % k:
                raise InputError(f"input {name!r}: batch size {np.shape(x)[0]} is not divisible by "
                                 f"micro_batches={k}")
    return k



# Loss ops that gather class labels, (domain, op type) -> index of the
# ignore_index input (the com.microsoft forms take it as an input), or None.
_LABEL_LOSSES = {
    ("", "SoftmaxCrossEntropyLoss"): None,
    ("", "NegativeLogLikelihoodLoss"): None,
    ("com.microsoft", "SoftmaxCrossEntropyLossInternal"): 3,
    ("com.microsoft", "NegativeLogLikelihoodLossInternal"): 3,
}
# Ops between a label input and the loss that keep the label values.
_SAME_VALUES = ("Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _label_checks(model: onnx.ModelProto, user_inputs) -> list:
    """``(input name, scores value, ignore_index or None)`` for each label loss fed by a user input."""
    producers = {o: n for n in model.graph.node for o in n.output if o}
    constants = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.attribute:
            if n.attribute[0].type == onnx.AttributeProto.TENSOR:
                constants[n.output[0]] = n.attribute[0].t
    checks = []
    for node in model.graph.node:
        key = (normalize_domain(node.domain), node.op_type)
        if key not in _LABEL_LOSSES or len(node.input) < 2:
            continue
        source = node.input[1]
        while source not in user_inputs and source in producers and \
                producers[source].op_type in _SAME_VALUES and normalize_domain(producers[source].domain) == "":
            source = producers[source].input[0]
        if source not in user_inputs:
            continue
        ignore = None
        slot = _LABEL_LOSSES[key]
        if slot is None:
            for attr in node.attribute:
                if attr.name == "ignore_index":
                    ignore = int(attr.i)
        elif len(node.input) > slot and node.input[slot] in constants:
            ignore = int(tensor_to_numpy(constants[node.input[slot]]).reshape(()))
        checks.append((source, node.input[0], ignore))
    return checks


def _static_class_counts(model: onnx.ModelProto, scores: set) -> dict:
    """scores value -> number of classes (dim 1), where shape inference makes it static."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  inference is an optimisation here; the fallback traces
        return {}
    counts = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim
        if vi.name in scores and len(dims) >= 2 and dims[1].HasField("dim_value"):
            counts[vi.name] = int(dims[1].dim_value)
    return counts


class InputChecker:
    """Checks the user inputs and labels of one model before its compiled step runs.

    Args:
      model: the training or eval model.
      info: its ``TrainingModelInfo``.
      names: the inputs a step takes: the graph's user inputs, then labels.
      layout: the parameters' shapes and dtypes (to learn a class count by
        an abstract trace when shape inference leaves it symbolic).
    """

    def __init__(self, model: onnx.ModelProto, info, names: Sequence[str], layout: ParameterLayout):
        self.names = tuple(names)
        declared = {vi.name: vi.type.tensor_type for vi in model.graph.input
                    if vi.type.HasField("tensor_type")}
        self.specs = []
        for name in self.names:
            tt = declared.get(name)
            if tt is None:  # a label of a JAX loss_fn: the model does not declare it
                self.specs.append((name, None, None))
                continue
            dtype = np.dtype(to_numpy_dtype(tt.elem_type)) if tt.elem_type else None
            shape = None
            if tt.HasField("shape"):
                shape = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None)
                              for d in tt.shape.dim)
            self.specs.append((name, shape, dtype))
        # (position among the inputs, name, scores, ignore_index) of each label checked.
        self.labels = tuple((self.names.index(name), name, scores, ignore)
                            for name, scores, ignore in _label_checks(model, set(self.names)))
        self._counts = _static_class_counts(model, {s for _, _, s, _ in self.labels}) if self.labels else {}
        self._model, self._info, self._layout = model, info, layout
        self._traced_counts: dict = {}
        self._lock = threading.Lock()
        # Signatures (type, dtype, shape of each input) that passed the checks
        # of check_input unchanged: a batch like the previous ones skips them.
        self._passed: set = set()

    def check(self, inputs: tuple) -> tuple:
        """The inputs, checked; nested lists are converted to numpy arrays of the declared dtype.

        Raises:
          InputError: a wrong count; a value that is not an array; a dtype
            other than the declared one; a wrong rank or static dim; a class
            label out of range.
        """
        if len(inputs) != len(self.names):
            raise InputError(f"the model takes {len(self.names)} inputs {list(self.names)}, "
                             f"given {len(inputs)}")
        try:
            signature = ()
            for x in inputs:  # a loop, not a comprehension: Python 3.11 gives that a frame of its own
                signature += ((type(x), x.dtype, x.shape),)
        except AttributeError:  # a list or a scalar: checked (and converted) below
            signature = None
        if signature is None or signature not in self._passed:
            out = tuple(check_input(*spec, x) for spec, x in zip(self.specs, inputs))
            if signature is not None and len(self._passed) < _PASSED_SIGNATURES and \
                    all(o is x for o, x in zip(out, inputs)):
                self._passed.add(signature)
            inputs = out
        if self.labels:
            self._check_labels(inputs)
        return inputs

    def check_stacked(self, inputs: tuple) -> tuple:
        """Batches stacked along a leading axis, checked as :meth:`check` checks one batch.

        Raises:
          InputError: as :meth:`check`, for any of the batches; inputs
            without a common leading length, or of length 0.
        """
        if len(inputs) != len(self.names):
            raise InputError(f"the model takes {len(self.names)} inputs {list(self.names)}, "
                             f"given {len(inputs)}")
        inputs = tuple(x if hasattr(x, "shape") and hasattr(x, "dtype") else np.asarray(x) for x in inputs)
        lengths = [x.shape[0] if x.ndim else None for x in inputs]
        if None in lengths or len(set(lengths)) != 1 or lengths[0] == 0:
            shapes = ", ".join(f"{n!r} {list(x.shape)}" for n, x in zip(self.names, inputs))
            raise InputError(f"stacked batches need one leading axis of the same, nonzero length "
                             f"on every input: given {shapes}")
        first = self.check(tuple(x[0] for x in inputs))
        # The first batch's checks (and any conversion) hold for all: same shapes and dtypes.
        inputs = tuple(x if x.dtype == f.dtype else np.asarray(x, dtype=f.dtype) for x, f in zip(inputs, first))
        if self.labels:
            for k in range(1, lengths[0]):
                self._check_labels(tuple(x[k] for x in inputs))
        return inputs

    def _check_labels(self, inputs: tuple) -> None:
        for index, name, scores, ignore in self.labels:
            labels = inputs[index]
            if type(labels) is not np.ndarray:
                if isinstance(labels, jax.core.Tracer):
                    continue
                labels = np.asarray(labels)
            count = self._counts.get(scores) or self._traced_count(scores, inputs)
            if count is None:
                continue
            # One reduction settles the common case (every label valid) at a
            # fraction of the cost of the masks below, which name the culprits.
            if labels.size == 0 or _all_below(labels, count):
                continue
            bad = (labels < 0) | (labels >= count)
            if ignore is not None:
                bad &= labels != ignore
            if bad.any():
                where = np.argwhere(bad)
                first = tuple(int(i) for i in where[0])
                valid = f"0 to {count - 1}" + (f", or the ignore_index {ignore}" if ignore is not None else "")
                raise InputError(
                    f"input {name!r} has {len(where)} class label(s) out of range, e.g. {labels[first]} "
                    f"at index {list(first)}: the scores {scores!r} have {count} classes, so labels "
                    f"must be {valid}")

    def _traced_count(self, scores: str, inputs: tuple):
        """The class count from an abstract trace of the forward graph (symbolic dims), cached by shapes."""
        key = (scores,) + tuple((tuple(np.shape(x)), str(np.asarray(x).dtype) if not hasattr(x, "dtype")
                                 else str(x.dtype)) for x in inputs)
        with self._lock:
            if key in self._traced_counts:
                return self._traced_counts[key]
        graph_inputs = list(self._info.input_names)
        try:
            sliced = ort_artifacts.slice_model(self._model, [scores], keep_inputs=graph_inputs)
            names = {i.name for i in sliced.graph.input}
            graph = JaxGraph(sliced, params=list(self._info.param_initializers),
                             param_inputs=[p for p in self._info.param_inputs if p in names],
                             inputs=graph_inputs, outputs=[scores], check=False)
            params = {n: jax.ShapeDtypeStruct(self._layout.shapes[n], self._layout.dtypes[n])
                      for n in list(graph.params) + list(graph.param_inputs)}
            args = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in inputs[:len(graph_inputs)]]
            (shape,) = jax.eval_shape(graph.apply, params, *args)
            count = int(shape.shape[1])
        except (JaxortError, IndexError, KeyError):
            count = None
        with self._lock:
            self._traced_counts[key] = count
        return count


_UNSIGNED = {np.dtype(f"int{8 * n}"): np.dtype(f"uint{8 * n}") for n in (1, 2, 4, 8)}


# How many input signatures an InputChecker remembers as checked.
_PASSED_SIGNATURES = 64

# Up to this many labels, _all_below compares them in Python.
_LIST_LABELS = 64


def _all_below(labels: np.ndarray, count: int) -> bool:
    """Whether every value of ``labels`` is in ``[0, count)``."""
    if labels.size <= _LIST_LABELS:
        # Run between two compiled steps, numpy's reductions and views cost
        # several times what they cost alone: the step has evicted numpy's
        # code and data from the caches (~30 us against ~11 us for 64 labels
        # as a list, one core; docs/benchmarks.md). The list's values are
        # exact Python numbers, so unsigned and 64-bit labels compare exactly.
        values = (labels if labels.ndim == 1 else labels.ravel()).tolist()
        return not values or (min(values) >= 0 and max(values) < count)
    unsigned = _UNSIGNED.get(labels.dtype)
    if unsigned is not None:  # seen as unsigned, a negative label is larger than any class count
        return int(np.maximum.reduce(labels.view(unsigned), axis=None)) < count
    return bool(labels.min() >= 0 and labels.max() < count)
