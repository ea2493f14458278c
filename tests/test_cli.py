"""The jaxort command line on bad arguments: one line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import onnx
import pytest

from jaxort.cli import main

CASE = pathlib.Path(__file__).resolve().parent / "fixtures" / "ort_api" / "frozen_sgd"
EXPORT = ["export", "--checkpoint", str(CASE / "checkpoint"), "--training-model", str(CASE / "training_model.onnx"),
          "--eval-model", str(CASE / "eval_model.onnx")]


def _fails(capsys, argv, status, line, traceback=False):
    assert main(argv) == status
    err = capsys.readouterr().err
    assert ("Traceback" in err) is traceback
    assert err.strip().splitlines()[-1] == line
    return err


def test_summary_of_a_fifo_or_missing_file(capsys, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _fails(capsys, ["summary", str(fifo)], 2, f"jaxort summary: error: checkpoint {str(fifo)!r} is not a regular file")
    _fails(capsys, ["summary", str(tmp_path / "nope")], 2,
           f"jaxort summary: error: checkpoint {str(tmp_path / 'nope')!r}: No such file or directory")


def test_export_to_a_missing_directory_or_onto_a_directory(capsys, tmp_path):
    out = tmp_path / "missing" / "m.onnx"
    _fails(capsys, EXPORT + [str(out)], 2,
           f"jaxort export: error: output {str(out)!r}: directory {str(out.parent)!r} does not exist")
    _fails(capsys, EXPORT + [str(tmp_path)], 2,
           f"jaxort export: error: output {str(tmp_path)!r} is a directory; give a file path")


def test_export_output_names_do_not_swallow_the_output_path(capsys, tmp_path):
    out = tmp_path / "m.onnx"
    assert main(EXPORT + ["--output-names", "output", str(out)]) == 0
    assert [o.name for o in onnx.load(str(out)).graph.output] == ["output"]
    out2 = tmp_path / "m2.onnx"
    assert main(EXPORT + [str(out2), "--output-names", "output"]) == 0 and out2.exists()
    _fails(capsys, EXPORT + ["--output-names", "nope", str(tmp_path / "m3.onnx")], 1,
           "jaxort export: output names ['nope'] are not values of the eval model; its outputs are "
           "['onnx::loss::2']")


def test_demo_bad_out_and_epochs(capsys, tmp_path):
    existing = tmp_path / "file"
    existing.write_text("x")
    _fails(capsys, ["demo", "--out", str(existing)], 2,
           f"jaxort demo: error: --out {str(existing)!r} exists and is not a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root may write anyway
            _fails(capsys, ["demo", "--out", str(locked / "sub")], 2,
                   f"jaxort demo: error: --out {str(locked / 'sub')!r}: cannot create the directory: "
                   "Permission denied")
    finally:
        locked.chmod(0o700)
    _fails(capsys, ["demo", "--out", "/proc/jaxort-demo"], 2,
           "jaxort demo: error: --out '/proc/jaxort-demo': cannot create the directory: No such file or directory")
    for epochs in ("-1", "0", "x"):
        with pytest.raises(SystemExit) as info:
            main(["demo", "--epochs", epochs])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "argument --epochs: expected a positive integer" in err


def test_verbose_prints_the_traceback(capsys, tmp_path):
    err = _fails(capsys, ["summary", "--verbose", str(tmp_path / "nope")], 2,
                 f"jaxort summary: error: checkpoint {str(tmp_path / 'nope')!r}: No such file or directory",
                 traceback=True)
    assert "_regular_file" in err


def test_a_failing_command_in_a_subprocess_exits_1_with_one_line(tmp_path):
    bad = tmp_path / "bad_checkpoint"
    bad.write_bytes(b"not a checkpoint")
    result = subprocess.run([sys.executable, "-m", "jaxort", "summary", str(bad)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if "Warning" not in line]
    assert "Traceback" not in result.stderr and len(lines) == 1 and lines[0].startswith("jaxort summary: ")
