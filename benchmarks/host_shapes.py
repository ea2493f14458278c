"""What a new NonZero count costs: train steps of the corpus BART through ``jaxort.api``.

BART pools its decoder's last hidden state at the ``</s>`` tokens: Equal(input_ids, eos)
-> NonZero -> GatherND, so NonZero's output shape is the number of ``</s>`` tokens in the
batch. jaxort runs Equal and NonZero on the host before each train step
(``JaxGraph.host_values``) and the compiled step takes NonZero's indices as an input, so a
batch with a count seen before reuses its program and a new count compiles one more.

Times, on ORT's artifacts of ``tests/fixtures/models/bart`` (the compilation and step
caches off, so a compile is a compile): each train step (train, optimizer step, lazy
reset, as ORT's loop) with the corpus batch (4 rows, one ``</s>`` each: count 4), the
same count again, a batch with a second ``</s>`` in every row (count 8: a new shape), that
count again, and the time of ``host_values`` alone.

    python benchmarks/host_shapes.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time

os.environ.setdefault("JAXORT_COMPILATION_CACHE", "off")

import numpy as np  # noqa: E402

from jaxort.api import CheckpointState, Module, Optimizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "models" / "bart"
EOS = 2


def _step(module, optimizer, batch) -> float:
    start = time.perf_counter()
    loss = float(np.asarray(module(*batch)))
    optimizer.step()
    module.lazy_reset_grad()
    assert np.isfinite(loss)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with np.load(ROOT / "batches.npz") as f:
        ids, labels = f["train::input_ids"][0], f["train::labels"][0]
    more = ids.copy()
    more[:, 3] = EOS  # a second </s> in every row (BART pools at the last): NonZero returns 8 indices
    state = CheckpointState.load_checkpoint(str(ROOT / "checkpoint"))
    module = Module(str(ROOT / "training_model.onnx"), state, None)
    optimizer = Optimizer(str(ROOT / "optimizer_model.onnx"), module)
    program = module._state.session_state.program
    first = _step(module, optimizer, (ids, labels))
    same = [_step(module, optimizer, (ids, labels)) for _ in range(args.repeat)]
    new = _step(module, optimizer, (more, labels))
    again = [_step(module, optimizer, (more, labels)) for _ in range(args.repeat)]
    graph = program._steps.steps.train_graph
    params = {}
    host = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        graph.host_values(params, ids, labels)
        host.append(time.perf_counter() - start)
    result = {
        "first_step_s": first, "same_count_step_s": statistics.median(same),
        "new_count_step_s": new, "new_count_again_step_s": statistics.median(again),
        "host_values_s": statistics.median(host),
        "compiles": program.trace_count(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
