"""``jaxort train``, ``generate-artifacts``, ``inspect`` and ``export`` on real artifacts.

The acceptance test: training ORT's golden mlp_adamw artifacts, a run stopped
(``--stop-after``) or killed with SIGKILL and resumed ends with the same
parameters and losses as a run that never stopped.
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from jaxort import checkpoint as ckpt
from jaxort.cli import main
from jaxort.train_loop import read_metrics

GOLDEN = pathlib.Path(__file__).resolve().parent / "fixtures" / "golden" / "mlp_adamw"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def data(tmp_path):
    batches = np.load(GOLDEN / "batches.npz")
    path = tmp_path / "data.npz"
    np.savez(path, input=batches["train::input"].reshape(48, 20), labels=batches["train::labels"].reshape(48))
    eval_path = tmp_path / "eval.npz"
    np.savez(eval_path, input=batches["eval::input"], labels=batches["eval::labels"])
    return path, eval_path


def _train(data, out, *extra):
    path, eval_path = data
    return ["train", "--artifacts", str(GOLDEN), "--data", str(path), "--eval-data", str(eval_path),
            "--epochs", "3", "--batch-size", "8", "--lr", "0.01", "--every", "4", "--no-progress",
            "--checkpoint-out", str(out), *extra]


def _losses(path):
    return [r["loss"] for r in read_metrics(path) if r["event"] == "train"]


def test_one_epoch_in_file_order_matches_ort_golden_trajectory(data, tmp_path, capsys):
    out = tmp_path / "ck"
    assert main(["train", "--artifacts", str(GOLDEN), "--data", str(data[0]), "--batch-size", "8",
                 "--lr", "0.01", "--no-shuffle", "--no-progress", "--checkpoint-out", str(out)]) == 0
    calls = json.loads((GOLDEN / "trajectory.json").read_text())["calls"]
    ort_losses = [c["result"]["loss"] for c in calls if c["call"] == "module.__call__" and c.get("mode") == "train"]
    np.testing.assert_allclose(_losses(f"{out}.metrics.jsonl"), ort_losses, rtol=1e-6)
    saved = ckpt.load(out)
    reference = np.load(GOLDEN / "params_after.npz")
    for name in reference.files:
        np.testing.assert_allclose(saved.trainable[name], reference[name], rtol=1e-5, atol=1e-6)
    assert saved.optimizer_group().step == 6
    assert saved.properties["jaxort.train.step"] == 6 and saved.properties["jaxort.train.epoch"] == 1
    assert (tmp_path / "ck.loss.png").read_bytes()[:8] == PNG
    assert "done: 6 steps" in capsys.readouterr().out


def test_stopped_and_resumed_run_equals_an_uninterrupted_one(data, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(_train(data, full)) == 0
    assert main(_train(data, part, "--stop-after", "7")) == 0
    stopped = ckpt.load(part)
    assert stopped.optimizer_group().step == 7 and stopped.properties["jaxort.train.batch"] == 1
    assert main(_train(data, part, "--resume", str(part))) == 0
    a, b = ckpt.load(full), ckpt.load(part)
    for name in a.trainable:
        np.testing.assert_array_equal(a.trainable[name], b.trainable[name])
        for m in ("momentum0", "momentum1"):
            np.testing.assert_array_equal(a.optimizer_group().states[name][m], b.optimizer_group().states[name][m])
    assert _losses(f"{full}.metrics.jsonl") == _losses(f"{part}.metrics.jsonl")
    assert len(_losses(f"{full}.metrics.jsonl")) == 18
    evals = [r for r in read_metrics(f"{full}.metrics.jsonl") if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [6, 12, 18]


def _as_npy_directory(path, folder):
    """The arrays of an .npz as a directory of <name>.npy files."""
    folder.mkdir()
    with np.load(path) as arrays:
        for name in arrays.files:
            np.save(folder / f"{name}.npy", arrays[name])
    return folder


@pytest.mark.parametrize("source", ["npz", "npy directory"])
def test_sigkill_after_step_k_then_resume_gives_the_uninterrupted_parameters(data, tmp_path, source):
    if source == "npy directory":  # the killed and resumed runs read rows from .npy files
        data = (_as_npy_directory(data[0], tmp_path / "data"), data[1])
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(_train(data, full, "--epochs", "40")) == 0
    log = pathlib.Path(f"{part}.metrics.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "jaxort", *_train(data, part, "--epochs", "40", "--every", "2")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if log.exists() and any(r.get("event") == "checkpoint" and r["step"] >= 10
                                    for r in _records(log)):
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = ckpt.load(part).properties["jaxort.train.step"]
    assert 10 <= killed_at < 240
    assert main(_train(data, part, "--epochs", "40", "--every", "2", "--resume", str(part))) == 0
    a, b = ckpt.load(full), ckpt.load(part)
    for name in a.trainable:
        np.testing.assert_array_equal(a.trainable[name], b.trainable[name])
    assert _losses(f"{full}.metrics.jsonl") == _losses(log)


def _records(path):
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def test_sigint_saves_a_checkpoint_and_exits_130(data, tmp_path):
    part = tmp_path / "part"
    log = pathlib.Path(f"{part}.metrics.jsonl")
    proc = subprocess.Popen([sys.executable, "-m", "jaxort", *_train(data, part, "--epochs", "400")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and len(_records(log)) >= 5):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    step = ckpt.load(part).properties["jaxort.train.step"]
    assert f"interrupted at step {step}; saved checkpoint to {part}" in stdout
    assert 0 < step < 2400 and "Traceback" not in stderr


def test_train_bad_inputs_are_one_line(data, tmp_path, capsys):
    def fails(argv, status, line):
        assert main(argv) == status
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().splitlines()[-1] == line

    out = str(tmp_path / "ck")
    base = ["train", "--artifacts", str(GOLDEN), "--checkpoint-out", out, "--no-progress"]
    fails(["train", "--artifacts", str(tmp_path / "nope"), "--data", str(data[0])], 2,
          f"jaxort train: error: --artifacts {str(tmp_path / 'nope')!r}: No such file or directory")
    fails(["train", "--artifacts", str(tmp_path), "--data", str(data[0])], 2,
          f"jaxort train: error: --artifacts {str(tmp_path)!r}: training_model.onnx "
          f"{str(tmp_path / 'training_model.onnx')!r}: No such file or directory")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04garbage")
    assert main(base + ["--data", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"jaxort train: --data {str(bad)!r} is not a readable .npz archive")
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros(3))
    fails(base + ["--data", str(npy)], 1,
          f"jaxort train: --data {str(npy)!r} is a single .npy array, not an .npz archive of named arrays")
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.zeros((8, 20), np.float32))
    fails(base + ["--data", str(wrong)], 1,
          f"jaxort train: --data {str(wrong)!r} has no array for the model input(s) ['input', 'labels']; "
          "the model takes ['input', 'labels'], the file has ['x']")
    fails(base + ["--data", str(data[0]), "--resume", str(GOLDEN / "checkpoint")], 1,
          f"jaxort train: --resume {str(GOLDEN / 'checkpoint')!r} was not written by jaxort train: "
          "it lacks optimizer state")
    fails(base + ["--data", str(data[0]), "--device", "abacus"], 2,
          "jaxort train: error: --device: unknown device 'abacus'; jaxort supports 'cpu', 'cuda', 'gpu' "
          "and 'tpu', optionally followed by ':<index>'")
    with pytest.raises(SystemExit) as info:
        main(base + ["--data", str(data[0]), "--lr", "-1"])
    assert info.value.code == 2 and "argument --lr: expected a positive number, got -1" in capsys.readouterr().err


def test_generate_artifacts_then_inspect_then_export(tmp_path, capsys):
    from jaxort.demo import build_digits_mlp

    model = tmp_path / "mlp.onnx"
    onnx.save(build_digits_mlp(hidden=8), model)
    out = tmp_path / "arts"
    assert main(["generate-artifacts", str(model), "--requires-grad", "fc2.weight,fc2.bias", "--frozen",
                 "fc1.weight,fc1.bias", "--loss", "CrossEntropyLoss", "--optimizer", "SGD",
                 "--additional-outputs", "output", "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "eval_model.onnx", "optimizer_model.onnx",
                                                     "training_model.onnx"]
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    params = {p["name"]: p for p in info["files"]["checkpoint"]["parameters"]}
    assert params["fc1.weight"] == {"name": "fc1.weight", "dtype": "float32", "shape": [64, 8],
                                    "trainable": False, "bytes": 64 * 8 * 4}
    assert params["fc2.bias"]["trainable"] is True
    ops = {(o["op_type"], o["status"]) for o in info["files"]["training_model.onnx"]["ops"]}
    assert ("MatMul", "supported") in ops and info["files"]["training_model.onnx"]["missing_ops"] == []
    assert info["files"]["optimizer_model.onnx"]["ops"] == [
        {"domain": "com.microsoft", "op_type": "SGDOptimizerV2", "opset": 1, "nodes": 1, "status": "supported"}]
    assert main(["inspect", str(out / "checkpoint")]) == 0
    text = capsys.readouterr().out
    assert "parameters: 4 (2 trainable, 2 frozen)" in text and "fc1.weight  float32  [64, 8]  False" in text

    exported = tmp_path / "inference.onnx"
    assert main(["export", "--artifacts", str(out), "--checkpoint", str(out / "checkpoint"), "-o", str(exported),
                 "--outputs", "output"]) == 0
    state = ckpt.load(out / "checkpoint")
    x = np.random.default_rng(0).random((3, 64)).astype(np.float32)
    (y,) = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"]).run(None, {"input": x})
    p = state.parameters
    np.testing.assert_allclose(y, np.maximum(x @ p["fc1.weight"] + p["fc1.bias"], 0) @ p["fc2.weight"]
                               + p["fc2.bias"], rtol=1e-5, atol=1e-6)


def test_generate_artifacts_names_an_op_without_a_gradient_rule(tmp_path, capsys, monkeypatch):
    # For an op with no gradient rule for ONNX Runtime's graph (Det, its rule taken away here):
    # by default the jaxort-only files and one warning line naming the node; --gradient-graph
    # makes it one error line; --no-gradient-graph writes the jaxort-only files without a word.
    from jaxort.training.artifacts.gradient import RULES

    monkeypatch.delitem(RULES, "Det")
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.normal(size=(3, 3)).astype(np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         onnx.helper.make_node("Det", ["h"], ["y"], name="probs")], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])], [w])
    model = tmp_path / "m.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), model)
    args = ["generate-artifacts", str(model), "--requires-grad", "w", "--loss", "MSELoss"]
    assert main(args + ["--gradient-graph", "-o", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'probs' (ai.onnx::Det) has no gradient rule" in err
    assert not (tmp_path / "a").exists() or not list((tmp_path / "a").iterdir())
    for flags, folder in (([], "b"), (["--no-gradient-graph"], "c")):
        assert main(args + flags + ["-o", str(tmp_path / folder)]) == 0
        train = onnx.load(tmp_path / folder / "training_model.onnx")
        assert [(n.domain, n.op_type) for n in train.graph.node if n.domain] == [("ai.jaxort", "NoGradientGraph")]
        err = capsys.readouterr().err.strip().splitlines()
        if flags:
            assert err == []
        else:
            assert len(err) == 1 and err[0].startswith("warning: jaxort-only artifacts, ONNX Runtime cannot")
            assert "'probs' (ai.onnx::Det) has no gradient rule" in err[0] and "--gradient-graph" in err[0]



def test_inspect_names_bfloat16_values_and_parameters(tmp_path):
    # onnx < 1.17's tensor_dtype_to_np_dtype calls bfloat16 float32 (and its size 4 bytes).
    import ml_dtypes
    from onnx import TensorProto, helper

    from jaxort.graph._model import tensor_from_numpy
    from jaxort.inspection import describe

    bf16 = TensorProto.BFLOAT16
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [helper.make_tensor_value_info("x", bf16, [2, 3])],
        [helper.make_tensor_value_info("y", bf16, [2, 4])],
        [tensor_from_numpy(np.ones((3, 4), ml_dtypes.bfloat16), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    info = describe(tmp_path / "m.onnx")
    assert info["inputs"] == [{"name": "x", "dtype": "bfloat16", "shape": [2, 3]}]
    assert info["parameters"] == [{"name": "w", "dtype": "bfloat16", "shape": [3, 4], "trainable": None,
                                   "bytes": 24}]

def test_inspect_and_generate_refuse_bad_files(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01not a model")
    assert main(["inspect", str(junk)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("jaxort inspect: ")
    broken = tmp_path / "broken_checkpoint"
    broken.write_bytes(b"\x08\x00\x00\x00ODTC" + b"\xff" * 8)
    assert main(["inspect", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("jaxort inspect: ")
    assert main(["generate-artifacts", str(junk), "--loss", "MSELoss", "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"jaxort inspect: error: path {str(tmp_path / 'nope')!r}: No such file or directory")
    with pytest.raises(SystemExit) as info:
        main(["generate-artifacts", str(junk), "--loss", "Hinge", "-o", str(tmp_path)])
    assert info.value.code == 2 and "argument --loss: invalid choice: 'Hinge'" in capsys.readouterr().err


def test_version_and_help_on_every_subcommand(capsys):
    from jaxort import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"jaxort {__version__}"
    for command in ("demo", "train", "generate-artifacts", "inspect", "summary", "export"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: jaxort {command}")


def test_a_directory_of_npy_files_trains_as_its_npz_does_reading_rows(data, tmp_path):
    # One <input name>.npy per model input, its rows read a batch at a time.
    from jaxort.train_loop import NpyRows, load_arrays

    folder = _as_npy_directory(data[0], tmp_path / "data")
    rows = load_arrays(folder)
    assert sorted(rows) == ["input", "labels"] and all(isinstance(v, NpyRows) for v in rows.values())
    with np.load(data[0]) as arrays:
        for name, reader in rows.items():
            whole = arrays[name]
            assert reader.shape == whole.shape and reader.dtype == whole.dtype and len(reader) == len(whole)
            np.testing.assert_array_equal(reader[np.array([5, 0, 47, 5])], whole[[5, 0, 47, 5]])
            np.testing.assert_array_equal(reader[8:16], whole[8:16])
            np.testing.assert_array_equal(reader[40:100], whole[40:])
            np.testing.assert_array_equal(reader[1:9:3], whole[1:9:3])
    from_npz, from_dir = tmp_path / "a", tmp_path / "b"
    assert main(_train(data, from_npz)) == 0
    assert main(_train((folder, data[1]), from_dir)) == 0
    assert _losses(f"{from_npz}.metrics.jsonl") == _losses(f"{from_dir}.metrics.jsonl")
    a, b = ckpt.load(from_npz), ckpt.load(from_dir)
    for name in a.trainable:
        np.testing.assert_array_equal(a.trainable[name], b.trainable[name])


def test_a_bad_directory_of_npy_files_is_one_line(data, tmp_path, capsys):
    base = ["train", "--artifacts", str(GOLDEN), "--checkpoint-out", str(tmp_path / "ck"), "--no-progress"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(base + ["--data", str(empty)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"jaxort train: --data {str(empty)!r} is a directory with no .npy file; it needs one <input name>.npy "
        "per model input")
    broken = tmp_path / "broken"
    broken.mkdir()
    np.save(broken / "input.npy", np.zeros((48, 20), np.float32))
    (broken / "labels.npy").write_bytes(b"\x93NUMPY garbage")
    assert main(base + ["--data", str(broken)]) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith(f"jaxort train: --data {str(broken / 'labels.npy')!r} cannot be read as a .npy array")
    short = tmp_path / "short"
    short.mkdir()
    np.save(short / "input.npy", np.zeros((48, 20), np.float32))
    (short / "labels.npy").write_bytes((tmp_path / "short" / "input.npy").read_bytes()[:300])
    assert main(base + ["--data", str(short)]) == 1
    assert "the file has 300 bytes, its header says" in capsys.readouterr().err
