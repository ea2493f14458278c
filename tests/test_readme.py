"""The README's code runs as written, and its results are right.

Every ```python block of README.md (and of docs/*.md) runs, in order, in one
namespace, in a fresh directory; the values the blocks compute are then
checked against numpy and onnxruntime. Every ``make`` target the documents
name exists in the Makefile and dry-runs.
"""

from __future__ import annotations

import pathlib
import re
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

from jaxort import checkpoint as ckpt

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M)


@pytest.fixture(scope="module")
def readme(tmp_path_factory, request):
    namespace = {"__name__": "readme"}
    work = tmp_path_factory.mktemp("readme")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        for i, block in enumerate(_python_blocks(ROOT / "README.md")):
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    return namespace, work


def _forward(x, w1, w2):
    return np.maximum(x @ w1, 0) @ w2


def _cross_entropy(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


def test_readme_has_code_to_run():
    assert len(_python_blocks(ROOT / "README.md")) >= 5


def test_model_as_a_function_matches_numpy(readme):
    ns, _ = readme
    w1, w2 = (np.asarray(ns["params"][n]) for n in ("fc1.weight", "fc2.weight"))
    x = ns["x"]
    want = _forward(x, w1, w2)
    np.testing.assert_allclose(np.asarray(ns["y"]), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ns["ys"]), want.reshape(4, 4, 3), rtol=1e-5, atol=1e-5)
    # d sum(relu(x w1) w2): w.r.t. w2 is relu(x w1)^T 1, w.r.t. w1 is x^T ((1 w2^T) * [x w1 > 0]).
    ones = np.ones_like(want)
    h = x @ w1
    np.testing.assert_allclose(np.asarray(ns["grads"]["fc2.weight"]), np.maximum(h, 0).T @ ones,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ns["grads"]["fc1.weight"]), x.T @ ((ones @ w2.T) * (h > 0)),
                               rtol=1e-5, atol=1e-5)


def test_training_lowers_the_loss_and_saves_what_it_trained(readme):
    ns, work = readme
    x, labels = ns["x"], ns["labels"]
    start = ckpt.load(work / "artifacts" / "checkpoint")
    w1, w2 = start.frozen["fc1.weight"], start.trainable["fc2.weight"]
    initial = _cross_entropy(_forward(x, w1, w2), labels)
    assert float(ns["eval_loss"]) < initial
    saved = ckpt.load(work / "checkpoint_out")
    assert saved.properties == {"epoch": 5}
    assert saved.optimizer_groups[0].step == 5
    np.testing.assert_array_equal(saved.frozen["fc1.weight"], w1)  # frozen stays frozen
    trained = saved.trainable["fc2.weight"]
    np.testing.assert_allclose(float(ns["eval_loss"]), _cross_entropy(_forward(x, w1, trained), labels),
                               rtol=1e-5)
    # The exported inference model runs in onnxruntime with the trained weights.
    sess = ort.InferenceSession(str(work / "inference.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = sess.run(["output"], {"input": x})
    np.testing.assert_allclose(logits, _forward(x, w1, trained), rtol=1e-5, atol=1e-5)


def test_session_and_core_blocks_continue_training(readme):
    ns, work = readme
    assert ns["buffer"].shape == (8 * 3,)  # the trainable fc2.weight, flattened
    core = ckpt.load(work / "checkpoint_core")
    # optimizer_step, train_and_update, then train_steps over two stacked batches
    assert core.optimizer_groups[0].step == 4
    assert np.shape(ns["losses"]) == (2,)
    assert not np.array_equal(core.trainable["fc2.weight"],
                              ckpt.load(work / "artifacts" / "checkpoint").trainable["fc2.weight"])


@pytest.mark.parametrize("doc", [d for d in DOCS[1:] if _python_blocks(d)], ids=lambda d: d.name)
def test_doc_code_blocks_run(doc, tmp_path, monkeypatch):
    # Each document's blocks run in order in one namespace of their own.
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": doc.stem}
    for i, block in enumerate(_python_blocks(doc)):
        exec(compile(block, f"{doc.name} python block {i + 1}", "exec"), namespace)


def _make_targets() -> set[str]:
    targets = set()
    for doc in DOCS:
        targets |= set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", doc.read_text()))
    return targets


@pytest.mark.parametrize("target", sorted(_make_targets()))
def test_documented_make_targets_exist(target):
    defined = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert target in defined, f"the docs name `make {target}`, which the Makefile does not define"
    dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
