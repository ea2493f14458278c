"""The digits demo: data, model, and a full run checked with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from jaxort import cli as cli_main
from jaxort import checkpoint as ckpt
from jaxort import demo


def test_digits_data():
    images, target = demo.load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert images.max() == 16 and images.min() == 0
    assert np.bincount(target).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    # First row of scikit-learn's digits.csv.gz (a zero).
    assert images[0, 0].tolist() == [0, 0, 5, 13, 9, 1, 0, 0] and target[0] == 0


def test_digits_mlp_runs_in_onnxruntime():
    model = demo.build_digits_mlp(hidden=8, seed=3)
    assert model.ir_version == 8 and model.opset_import[0].version == 17
    w = {t.name: np.frombuffer(t.raw_data, np.float32).reshape(t.dims) for t in model.graph.initializer}
    x = np.random.default_rng(0).random((5, 64)).astype(np.float32)
    (out,) = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"input": x})
    h = np.maximum(x @ w["fc1.weight"] + w["fc1.bias"], 0)
    np.testing.assert_allclose(out, h @ w["fc2.weight"] + w["fc2.bias"], rtol=1e-5, atol=1e-6)


def test_run_demo(tmp_path):
    lines = []
    result = demo.run_demo(tmp_path, log=lines.append)
    assert result["accuracy"] >= 0.9
    assert "accuracy" in lines[-1] and f"{result['accuracy']:.4f}" in lines[-1]
    assert any("steps/s" in line and "loss" in line for line in lines)
    assert str(result["checkpoint"]) in "\n".join(lines)
    assert str(result["inference_model"]) in "\n".join(lines)
    # The loss curve is a PNG beside the checkpoint, of every step's loss.
    png = result["loss_curve"].read_bytes()
    assert result["loss_curve"] == tmp_path / "loss_curve.png" and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == 600 and int.from_bytes(png[20:24], "big") == 400
    assert len(result["losses"]) == result["steps"] and result["losses"][-1] < result["losses"][0] / 5

    _, _, x_test, y_test = demo._split(0, 0.2)
    sess = ort.InferenceSession(str(result["inference_model"]), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(None, {"input": x_test})
    assert np.mean(np.argmax(logits, -1) == y_test) == pytest.approx(result["accuracy"])

    state = ckpt.load(result["checkpoint"])
    assert state.optimizer_group().step == result["steps"]
    eval_sess = ort.InferenceSession(str(result["artifacts"] / "eval_model.onnx"),
                                     providers=["CPUExecutionProvider"])
    loss, eval_logits = eval_sess.run(None, {"input": x_test, "labels": y_test, **state.parameters})
    np.testing.assert_allclose(loss, result["eval_loss"], rtol=1e-5)
    np.testing.assert_allclose(eval_logits, logits, rtol=1e-5, atol=1e-5)


def test_main_runs_demo_with_arguments(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: calls.append((out, kw)))
    assert cli_main.main(["demo", "--out", str(tmp_path), "--epochs", "3"]) == 0
    assert calls == [(str(tmp_path), {"epochs": 3, "seed": 0})]
