"""Hostile and careless use of the training facades and core: every failure a named jaxort error.

Checkpoints that do not fit the model, a second optimizer, future opsets,
short initializers, out-of-range labels, silent dtype conversions, bad
arguments and concurrent calls (issue 11, classes 7 to 14). Each case runs
on ONNX Runtime 1.19.2's own artifacts (tests/fixtures/ort_api/frozen_sgd:
input [batch, 12] float32, labels [batch] int64, 3 classes).
"""

from __future__ import annotations

import pathlib
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from jaxort import checkpoint as ckpt
from jaxort import errors, session
from jaxort.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from jaxort.graph import JaxGraph, load_model
from jaxort.training import TrainProgram

CASE = pathlib.Path(__file__).resolve().parent / "fixtures" / "ort_api" / "frozen_sgd"
TRAIN, EVAL, OPT, CKPT = (str(CASE / n) for n in
                          ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"))


@pytest.fixture(scope="module")
def batch():
    with np.load(CASE / "batches.npz") as f:
        return f["train::input"][0], f["train::labels"][0]


def _module(eval_model=True):
    state = CheckpointState.load_checkpoint(CKPT)
    return state, Module(TRAIN, state, EVAL if eval_model else None)


# 7. A checkpoint that does not match the model -----------------------------------

def _with(**params):
    data = ckpt.load(CKPT)
    return data.replace(trainable={**data.trainable, **{k: v for k, v in params.items() if k in data.trainable}},
                        frozen={**data.frozen, **{k: v for k, v in params.items() if k in data.frozen}})


def test_mismatched_checkpoint_is_refused_at_construction_listing_every_parameter():
    bad = _with(**{"fc1.weight": np.zeros((3, 3), np.float32), "fc2.weight": np.zeros((3, 8), np.float32),
                   "fc2.bias": np.zeros(3, np.float64)})
    with pytest.raises(errors.CheckpointError) as info:
        Module(TRAIN, CheckpointState(bad))
    message = str(info.value)
    assert "3 parameter(s) differ" in message
    assert "'fc1.weight': expected shape [12, 8] dtype float32, given shape [3, 3] dtype float32" in message
    assert "'fc2.weight': expected shape [8, 3] dtype float32, given shape [3, 8] dtype float32" in message
    assert "'fc2.bias': expected shape [3] dtype float32, given shape [3] dtype float64" in message
    with pytest.raises(errors.CheckpointError, match="'fc2.weight': expected shape"):
        session.TrainingSession(session.CheckpointHandle(_with(**{"fc2.weight": np.zeros((8, 4), np.float32)})),
                                TRAIN)


def test_mismatched_checkpoint_is_refused_by_the_core():
    program = TrainProgram.from_artifacts(TRAIN, checkpoint=ckpt.load(CKPT))
    with pytest.raises(errors.CheckpointError, match=r"'fc1.bias': expected shape \[8\] dtype float32, "
                                                     r"given shape \[8\] dtype float64"):
        program.init_state(_with(**{"fc1.bias": np.zeros(8, np.float64)}))


# 8. A second Optimizer takes over -------------------------------------------------

def test_second_optimizer_takes_over_and_the_first_is_refused(batch):
    state, module = _module()
    first = Optimizer(OPT, module)
    first.set_learning_rate(0.5)
    scheduler = LinearLRScheduler(first, 2, 10, 0.5)
    for _ in range(3):
        module(*batch)
        first.step()
    assert state.session_state.train.step == 3
    second = Optimizer(OPT, module)
    assert state.session_state.train.step == 0 and second.get_learning_rate() == pytest.approx(1e-3)
    for call in (first.step, first.get_learning_rate, lambda: first.set_learning_rate(0.1), scheduler.step):
        with pytest.raises(errors.StateError, match="this Optimizer was replaced"):
            call()
    module(*batch)
    second.step()
    assert state.session_state.to_checkpoint(True).optimizer_groups[0].step == 1


# 9. Opsets newer than onnx knows ---------------------------------------------------

def test_future_default_opset_is_refused():
    newest = onnx.defs.onnx_opset_version()
    model = onnx.load(TRAIN)
    model.opset_import[0].version = 99
    message = f"opset 99 of the default domain (ai.onnx); the installed onnx {onnx.__version__} supports " \
              f"opsets 1 to {newest}"
    with pytest.raises(errors.ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Module(model, CheckpointState.load_checkpoint(CKPT))
    forward = onnx.load(str(CASE / "model.onnx"))
    forward.opset_import[0].version = newest + 1
    with pytest.raises(errors.ModelError, match=f"supports opsets 1 to {newest}"):
        JaxGraph(forward, check=False)
    forward.opset_import[0].version = newest
    assert JaxGraph(forward, check=False).opsets[""] == newest


# 10. Broken initializers and unreadable models with check=False -------------------

def test_short_or_long_initializer_data_is_a_model_error():
    model = onnx.load(str(CASE / "model.onnx"))
    weight = model.graph.initializer[0]
    name, need = weight.name, int(np.prod(weight.dims)) * 4
    weight.raw_data = weight.raw_data[:-4]
    with pytest.raises(errors.ModelError, match=rf"initializer '{name}' of graph '.*': dims \[12, 8\] need "
                                                rf"{need} bytes of raw_data, given {need - 4}"):
        JaxGraph(model, check=False)
    typed = TensorProto(name="t", data_type=TensorProto.FLOAT, dims=[2, 3], float_data=[1.0] * 5)
    graph = helper.make_graph([helper.make_node("Identity", ["t"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [typed])
    with pytest.raises(errors.ModelError, match=r"initializer 't' of graph 'g': dims \[2, 3\] need 6 values "
                                                r"in float_data, given 5"):
        load_model(helper.make_model(graph), check=False)


def test_short_external_data_file_is_a_model_error(tmp_path):
    weights = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
              size_threshold=0)
    data = tmp_path / "m.data"
    data.write_bytes(data.read_bytes()[:40])
    # jaxort maps external data instead of loading it, and checks its size first, whatever the onnx version.
    with pytest.raises(errors.ModelError, match=r"initializer 'w' .*its external data cannot be read \(needs 64 "
                                                r"bytes at offset 0 of '.*m\.data', which holds 40 bytes\)"):
        JaxGraph(str(path), check=False)
    # A proto's relative location is taken from the working directory, where there is no m.data.
    proto = onnx.load(str(path), load_external_data=False)
    with pytest.raises(errors.ModelError, match=r"initializer 'w' .*its external data cannot be read .*'m\.data'"):
        load_model(proto, check=False)


def test_model_the_checker_cannot_parse_is_a_model_error():
    def leaf(i):
        return helper.make_graph([helper.make_node("Identity", ["x"], [f"l{i}"])], f"l{i}", [],
                                 [helper.make_tensor_value_info(f"l{i}", TensorProto.FLOAT, [2])])

    body = leaf(0)
    for i in range(1, 33):  # 32 nested Ifs: valid, but deeper than the checker's C++ parser reads
        node = helper.make_node("If", ["c"], [f"y{i}"])
        for attr_name, g in (("then_branch", body), ("else_branch", leaf(i))):
            attr = node.attribute.add()
            attr.name, attr.type = attr_name, onnx.AttributeProto.GRAPH
            attr.g.CopyFrom(g)
        body = helper.make_graph([node], f"g{i}", [], [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(list(body.node), "main", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                                        helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y32", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(errors.ModelError, match="onnx.checker cannot check the model .*pass check=False"):
        JaxGraph(model)
    (y,) = JaxGraph(model, check=False).apply({}, np.ones(2, np.float32), np.array(True))
    np.testing.assert_array_equal(y, [1.0, 1.0])


# 11. Class labels out of range -----------------------------------------------------

@pytest.mark.parametrize("label", [3, 7, -1, 2**40])
def test_out_of_range_labels_are_refused_in_train_and_eval(batch, label):
    state, module = _module()
    x, y = batch
    labels = y.copy()
    labels[2] = label
    before = module.get_contiguous_parameters()
    for mode in (module.train, module.eval):
        mode()
        with pytest.raises(errors.InputError, match=rf"input 'labels' has 1 class label\(s\) out of range, "
                                                    rf"e.g. {label} at index \[2\]: the scores '.*' have 3 "
                                                    r"classes, so labels must be 0 to 2$"):
            module(x, labels)
    np.testing.assert_array_equal(module.get_contiguous_parameters(), before)
    module.train()
    module(x, y)  # the state was left intact: training goes on


def _ignore_index_program(ignore_index):
    w = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["scores"]),
         helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"], reduction="mean", **attrs)],
        "ce", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
               helper.make_tensor_value_info("labels", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = ckpt.Checkpoint(trainable={"w": w}, frozen={})
    program = TrainProgram.from_artifacts(model, checkpoint=data)
    return program, program.init_state(data), w


def test_ignore_index_is_honoured_and_named_in_the_error():
    program, st, w = _ignore_index_program(-100)
    x = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    labels = np.array([4, -100, 0])
    st, (loss,) = program.train_step(st, x, labels)
    z = x @ w
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    np.testing.assert_allclose(loss, -(logp[0, 4] + logp[2, 0]) / 2, rtol=1e-5)
    with pytest.raises(errors.InputError, match=r"e.g. 5 at index \[0\].* have 5 classes, so labels must be "
                                                r"0 to 4, or the ignore_index -100$"):
        program.train_step(st, x, np.array([5, -100, 0]))


@pytest.mark.parametrize("n", [1, 64, 65, 200])
@pytest.mark.parametrize("bad", [5, -1, 2**40, -(2**40)])
def test_a_bad_label_is_found_in_short_and_long_batches(n, bad):
    # The valid-label check takes one path up to 64 labels and another above.
    program, st, _ = _ignore_index_program(None)
    x = np.linspace(0, 1, 4 * n, dtype=np.float32).reshape(n, 4)
    labels = np.arange(n, dtype=np.int64) % 5
    st, (loss,) = program.train_step(st, x, labels)
    assert np.isfinite(loss)
    for where in sorted({0, n // 2, n - 1}):
        wrong = labels.copy()
        wrong[where] = bad
        with pytest.raises(errors.InputError, match=rf"1 class label\(s\) out of range, e.g. {bad} at index "
                                                    rf"\[{where}\]"):
            program.train_step(st, x, wrong)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint64"])
def test_label_range_check_agrees_with_numpy(dtype):
    from jaxort.training.inputs import _all_below
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    for n in (1, 2, 63, 64, 65, 300):
        for _ in range(20):
            labels = rng.integers(max(info.min, -3), min(info.max, 12), size=n, endpoint=True).astype(dtype)
            if rng.random() < 0.3:
                labels[rng.integers(n)] = info.max if rng.random() < 0.5 else info.min
            for view in (labels, labels[::2], labels.reshape(-1, 1)[:, 0], labels.reshape(-1, 1),
                         labels[None, ::3]):
                for count in (1, 10, 13):
                    expected = bool(((view.astype(np.int64) >= 0) & (view < count)).all()) if view.size else True
                    assert _all_below(view, count) is expected, (dtype, n, count, view)


# 12. No silent dtype conversion ------------------------------------------------------

def test_mismatched_input_dtypes_are_refused_naming_the_given_dtype(batch):
    _, module = _module()
    x, y = batch
    with pytest.raises(errors.InputError, match=r"input 'input': expected dtype float32, given float64; .*"
                                                r"pass it as float32 \(e.g. x.astype\(np.float32\)\)"):
        module(x.astype(np.float64), y)
    with pytest.raises(errors.InputError, match=r"input 'labels': expected dtype int64, given int32"):
        module(x, y.astype(np.int32))
    with pytest.raises(errors.InputError, match=r"input 'input': expected shape \['batch', 12\] dtype float32, "
                                                r"given shape \[4, 3\] dtype float32"):
        module(x[:, :3], y)
    expected = module(x, y)
    # Lists have no dtype of their own: they take the declared one.
    np.testing.assert_allclose(module(x.tolist(), y.tolist()), module(x, y) - 0 * expected, rtol=1e-5)


def test_inputs_are_checked_in_full_after_batches_that_passed(batch):
    # A batch of the same types, dtypes and shapes as one that passed skips
    # the per-input checks: every other batch must still meet them.
    import jax

    _, module = _module()
    x, y = batch
    for _ in range(3):
        module(x, y)
    bad = [((x.astype(np.float64), y), r"input 'input': expected dtype float32, given float64"),
           ((x, y.astype(np.int32)), r"input 'labels': expected dtype int64, given int32"),
           ((x[:, :3], y), r"input 'input': expected shape \['batch', 12\] dtype float32, given shape \[4, 3\]"),
           ((x[None], y), r"input 'input': expected shape \['batch', 12\].* given shape \[1, 4, 12\]"),
           ((x, np.full_like(y, 3)), r"input 'labels' has 4 class label\(s\) out of range"),
           ((x, y, y), r"takes 2 inputs \['input', 'labels'\], given 3")]
    for inputs, message in bad:
        with pytest.raises(errors.InputError, match=message):
            module(*inputs)
    # Other forms of the same batch take the same step as the numpy arrays.
    expected = [module(x, y) for _ in range(2)]
    state2, module2 = _module()
    got = [module2(x.tolist(), y.tolist()), module2(jax.numpy.asarray(x), y)]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_jaxgraph_refuses_a_numpy_float64_for_a_float32_input():
    graph = JaxGraph(str(CASE / "model.onnx"))
    x = np.ones((2, 12))
    with pytest.raises(errors.InputError, match=r"input 'input' has the wrong dtype: expected shape "
                                                r"\['batch', 12\] dtype float32, given shape \[2, 12\] "
                                                r"dtype float64"):
        graph.apply(graph.params, x)
    (out,) = graph.apply(graph.params, x.astype(np.float32))
    assert out.shape == (2, 3) and out.dtype == np.float32


# 13. Facade arguments ----------------------------------------------------------------

def test_bad_facade_arguments_raise_jaxort_errors(batch, tmp_path):
    state, module = _module()
    opt = Optimizer(OPT, module)
    x, y = batch
    cases = [
        (lambda: module(None, y), errors.InputError, "input 'input': expected an array"),
        (lambda: opt.set_learning_rate("abc"), errors.InputError, "learning rate must be a number"),
        (lambda: LinearLRScheduler(opt, "a", 10, 0.1), errors.InputError, "warmup_step_count must be an integer"),
        (lambda: LinearLRScheduler(opt, 1, 10, float("nan")), errors.InputError, "initial_lr must be finite"),
        (lambda: module.export_model_for_inferencing(tmp_path / "m.onnx", "output"), errors.InputError,
         "graph_output_names must be a list of str"),
        (lambda: module.export_model_for_inferencing(None, ["output"]), errors.ArgumentTypeError,
         "inference_model_uri must be a path"),
        (lambda: module.get_contiguous_parameters("yes"), errors.ArgumentTypeError, "trainable_only must be a bool"),
        (lambda: module.train("x"), errors.ArgumentTypeError, "mode must be a bool"),
        (lambda: Module(TRAIN, None), errors.ArgumentTypeError, "state must be a jaxort.api.CheckpointState"),
        (lambda: Optimizer(OPT, None), errors.ArgumentTypeError, "module must be a jaxort.api.Module"),
        (lambda: Optimizer(123, module), errors.ModelError, "expected a path, bytes or onnx.ModelProto"),
        (lambda: CheckpointState.load_checkpoint(None), errors.ArgumentTypeError, "checkpoint_uri must be a path"),
        (lambda: CheckpointState.save_checkpoint(state, 5), errors.ArgumentTypeError, "checkpoint_uri must be a path"),
        (lambda: CheckpointState.save_checkpoint(None, "x"), errors.ArgumentTypeError, "state must be"),
        (lambda: session.TrainingSession(None, TRAIN), errors.InputError, "state must be a jaxort.session"),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind, match=message.replace("(", r"\(")):
            call()
    assert issubclass(errors.ArgumentTypeError, TypeError)


# 14. Concurrent calls ------------------------------------------------------------------

def test_threads_calling_one_module_lose_no_optimizer_step(batch):
    state, module = _module()
    opt = Optimizer(OPT, module)
    x, y = batch
    failures, steps, threads = [], 8, 3

    def work():
        try:
            for _ in range(steps):
                module(x, y)
                opt.step()
                state.parameters["fc2.bias"].data
                module.get_contiguous_parameters()
        except Exception as exc:  # noqa: BLE001  collected and asserted below
            failures.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert failures == []
    assert state.session_state.to_checkpoint(True).optimizer_groups[0].step == steps * threads


def test_threads_calling_one_training_session_lose_no_optimizer_step(batch):
    handle = session.load_checkpoint(CKPT)
    training = session.TrainingSession(handle, TRAIN, EVAL, OPT)
    x, y = batch
    failures = []

    def work():
        try:
            for _ in range(6):
                training.train_step(x, y)
                training.optimizer_step()
                handle.get_parameter("fc2.weight")
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    workers = [threading.Thread(target=work) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert failures == []
    assert handle.to_checkpoint(True).optimizer_groups[0].step == 18
