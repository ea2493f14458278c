"""benchmarks/bench_models.py, run briefly: what it reports, never how fast anything is."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    # The script imports its sibling suite.py, as it does when run from benchmarks/.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_models", ROOT / "benchmarks" / "bench_models.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_the_corpus_is_every_model_folder(bench):
    names = bench.corpus()
    assert "lstm" in names and "bert" in names
    assert names == sorted(p.name for p in (ROOT / "tests" / "fixtures" / "models").iterdir() if p.is_dir())


def test_a_model_run_starts_from_orts_recorded_loss_and_reports_its_rounds(bench):
    result = bench.run_model("lstm", "default", rounds=2, time_slice=0.02, warmup=1)
    recorded = np.load(ROOT / "tests" / "fixtures" / "models" / "lstm" / "expected.npz")["losses"][0]
    api = result["systems"]["api_ort"]
    assert api["first_loss"] == pytest.approx(float(recorded), rel=1e-5)
    figures = api["train_steps_per_s"]
    assert figures["n"] == 2 and len(api["rounds"]) == 2
    assert all(math.isfinite(r) and r > 0 for r in api["rounds"])
    assert figures["min"] <= figures["median"] <= figures["max"]
    table = bench.markdown({"configs": [result]})
    assert "| lstm | default |" in table
    named = bench.markdown({"configs": [result], "rounds": 2, "slice_s": 0.02,
                            "machine": {"cpus": 2, "cpu": "Some CPU"}})
    assert named.startswith("2 CPUs (Some CPU), 2 rounds of 0.02 s per system.") and named.endswith(table)
    if "ort" in result["systems"]:  # where onnxruntime-training is importable
        pairs = [a / o for a, o in zip(api["rounds"], result["systems"]["ort"]["rounds"])]
        assert result["api_ort/ort"]["median"] == pytest.approx(float(np.median(pairs)))


def test_an_unknown_model_is_refused_naming_the_corpus(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--models", "lstm,resnet50"])
    err = capsys.readouterr().err
    assert "not in the corpus: resnet50" in err and "lstm" in err
