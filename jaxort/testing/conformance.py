"""Runs ONNX's backend node test cases through ``jaxort.backend``.

Usage::

    python -m jaxort.testing.conformance [--ops Add,Conv|core] [--timeout 60] [--jobs 2]

Each case runs in a worker process under a time limit (a case over the limit
counts as failed and its worker is replaced); ``--jobs 0`` runs them in this
process instead, as the test suite does for the core ops. Prints the failures
grouped by op and passed/total. The comparison follows ONNX's own backend test
runner: equal dtypes, exact equality for strings, ``assert_allclose`` with the
case's rtol/atol otherwise.

Random ops (``RANDOM_OPS``: Bernoulli, Dropout in training mode) are the one
exception. ONNX's expected outputs for them are draws of numpy's RNG (its case
generators call ``np.random`` unseeded, or with numpy's own seed), which no
other generator reproduces. A random-op case whose outputs differ from the file
is checked instead by the properties every valid draw has
(:func:`check_random_outputs`: dtypes and shapes, support, the exact values
where the draw is certain, Dropout's ``y == x * mask / (1 - ratio)``, the kept
fraction within six standard deviations, a Bernoulli ``seed`` attribute giving
the same draw twice) and counted apart: the summary gives the strict count (outputs
equal to the file) and the count with those cases.

This module may import the graph layer (``jaxort.backend``), never the facades.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import sys
import time
import warnings

import numpy as np

# The ops every training and inference graph jaxort targets needs; all of their
# ONNX node cases must pass (``make test`` runs them).
CORE_OPS = tuple("""
Add Sub Mul Div Pow Neg Abs Exp Log Sqrt Reciprocal Floor Ceil Round Sign Relu LeakyRelu
PRelu Elu Selu Celu Sigmoid HardSigmoid HardSwish Tanh Softplus Softsign Erf Gelu Mish MatMul
Gemm Einsum Conv ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool LpPool
BatchNormalization LayerNormalization InstanceNormalization GroupNormalization Dropout Softmax
LogSoftmax Hardmax Identity Cast CastLike Reshape Flatten Transpose Squeeze Unsqueeze Concat
Split Slice Gather GatherElements GatherND ScatterElements ScatterND Expand Tile Pad Shape Size
ConstantOfShape Constant Range Where Equal Less Greater LessOrEqual GreaterOrEqual Not And Or
Xor Clip Min Max Sum Mean ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1
ReduceL2 ReduceLogSumExp ReduceSumSquare ArgMax ArgMin Trilu CumSum SoftmaxCrossEntropyLoss
NegativeLogLikelihoodLoss OneHot TopK DepthToSpace SpaceToDepth Resize If Loop Scan
""".split())

# Ops whose expected outputs in ONNX's cases are draws of numpy's RNG.
RANDOM_OPS = frozenset({"Bernoulli", "Dropout"})
# The message of a random-op case that passed by its properties, not by equality.
BY_PROPERTY = "random op: checked by property"

__all__ = ["BY_PROPERTY", "CORE_OPS", "RANDOM_OPS", "case_op_type", "check_random_outputs",
           "collect_cases", "compare_outputs", "main", "run_all", "run_case", "run_in_process"]


def collect_cases(op_types=None) -> list:
    """Returns ONNX's node test cases, optionally only those of some op types."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # onnx < 1.17 requires the filter argument; None keeps every case.
        cases = list(collect_testcases(None))
    _index_op_types(cases)
    if op_types:
        wanted = set(op_types)
        cases = [c for c in cases if case_op_type(c) in wanted]
    return cases


_OP_OF_CASE: dict = {}


def _index_op_types(cases) -> None:
    for c in cases:
        if "_expanded" not in c.name:
            _OP_OF_CASE[c.name] = _node_op_type(c)
    for c in cases:
        if "_expanded" in c.name:
            base = c.name.split("_expanded")[0]
            _OP_OF_CASE[c.name] = _OP_OF_CASE.get(base) or _node_op_type(c)


def _node_op_type(case) -> str:
    nodes = list(case.model.graph.node)
    for n in nodes:
        if n.op_type != "Constant" or len(nodes) == 1:
            return n.op_type
    return nodes[0].op_type if nodes else "?"


def case_op_type(case) -> str:
    """The op type a node case tests; an ``*_expanded`` case counts for the op it expands."""
    return _OP_OF_CASE.get(case.name) or _node_op_type(case)


def compare_outputs(expected, got, rtol: float, atol: float) -> None:
    """Asserts ``got`` matches ``expected`` like ONNX's backend runner does."""
    assert len(expected) == len(got), f"expected {len(expected)} outputs, got {len(got)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        _compare_one(e, g, rtol, atol, f"output {i}")


def _compare_one(e, g, rtol, atol, where):
    if isinstance(e, (list, tuple)):
        assert isinstance(g, (list, tuple)), f"{where}: expected a sequence, got {type(g).__name__}"
        assert len(e) == len(g), f"{where}: sequence length {len(g)} != {len(e)}"
        for j, (ee, gg) in enumerate(zip(e, g)):
            _compare_one(ee, gg, rtol, atol, f"{where}[{j}]")
        return
    if e is None:
        assert g is None, f"{where}: expected None"
        return
    e = np.asarray(e)
    g = np.asarray(g)
    assert e.dtype == g.dtype, f"{where}: dtype {g.dtype} != expected {e.dtype}"
    assert e.shape == g.shape, f"{where}: shape {g.shape} != expected {e.shape}"
    if e.dtype == object or e.dtype.kind in "SU":
        np.testing.assert_array_equal(g, e, err_msg=where)
    elif e.dtype.kind in "biu" or e.dtype == np.bool_:
        np.testing.assert_array_equal(g, e, err_msg=where)
    else:
        np.testing.assert_allclose(
            g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol, err_msg=where)


def run_case(case, by_property: bool = False) -> None:
    """Runs one case through ``jaxort.backend``; raises AssertionError on mismatch.

    With ``by_property``, outputs are checked by :func:`check_random_outputs`
    instead of by equality with the file (for :data:`RANDOM_OPS` cases).
    """
    from jaxort import backend

    rep = backend.prepare(case.model, "CPU")
    for inputs, expected in _data_sets(case):
        got = list(rep.run(inputs))
        if not by_property:
            compare_outputs(expected, got, case.rtol, case.atol)
            continue
        check_random_outputs(case.model, inputs, expected, got, case.rtol, case.atol)
        if _seeded(case.model):
            again = list(backend.prepare(case.model, "CPU").run(inputs))
            for i, (g, a) in enumerate(zip(got, again)):
                np.testing.assert_array_equal(
                    np.asarray(a), np.asarray(g),
                    err_msg=f"output {i}: a seed attribute must give the same draw twice")


def _data_sets(case):
    in_types = [_declared_dtype(v) for v in case.model.graph.input]
    out_types = [_declared_dtype(v) for v in case.model.graph.output]
    for inputs, expected in case.data_sets:
        yield ([_as_declared(_to_value(x), t) for x, t in zip(inputs, in_types)],
               [_as_declared(_to_value(x), t) for x, t in zip(expected, out_types)])


def _seeded(model) -> bool:
    """True when a Bernoulli (or its expansion's RandomUniformLike) has a seed: jaxort
    then repeats its draw. Dropout draws anew on every run, seed or not, as ORT does."""
    return any(a.name == "seed" for n in model.graph.node if n.op_type != "Dropout"
               for a in n.attribute)


def _random_op_type(model) -> str:
    for node in model.graph.node:
        if node.op_type in RANDOM_OPS:
            return node.op_type
    # An *_expanded Bernoulli: RandomUniformLike, Less, Cast.
    if any(n.op_type == "RandomUniformLike" for n in model.graph.node):
        return "Bernoulli"
    raise AssertionError("the model has no random op")


def check_random_outputs(model, inputs, expected, got, rtol: float, atol: float) -> None:
    """Asserts ``got`` is a valid draw of the model's random op for ``inputs``.

    ``expected`` (the file's draw) gives only the dtypes and shapes. Bernoulli:
    values in {0, 1}, exactly 0 where the probability is 0 and 1 where it is 1,
    and the number of ones within six standard deviations of the sum of the
    probabilities. Dropout (inputs data, ratio, training_mode): with a mask
    output, the mask is boolean and ``y == where(mask, x / (1 - ratio), 0)``;
    without one, every element is 0 or ``x / (1 - ratio)``; the kept fraction
    is within six standard deviations of ``1 - ratio``; outside training mode or
    with ratio 0 the output is ``x`` and the mask all true.
    """
    assert len(got) == len(expected), f"expected {len(expected)} outputs, got {len(got)}"
    got = [np.asarray(g) for g in got]
    for i, (e, g) in enumerate(zip(expected, got)):
        e = np.asarray(e)
        assert g.dtype == e.dtype, f"output {i}: dtype {g.dtype} != expected {e.dtype}"
        assert g.shape == e.shape, f"output {i}: shape {g.shape} != expected {e.shape}"
    if _random_op_type(model) == "Bernoulli":
        _check_bernoulli(np.asarray(inputs[0], np.float64), got[0].astype(np.float64))
    else:
        _check_dropout(inputs, got, rtol, atol)


def _within_six_sigma(count, mean, variance, what):
    assert abs(count - mean) <= 6.0 * np.sqrt(variance) + 1e-9, (
        f"{what}: {count} is more than six standard deviations from its expectation {mean:g}")


def _check_bernoulli(p, y):
    values = set(np.unique(y).tolist())
    assert values <= {0.0, 1.0}, f"Bernoulli output holds values other than 0 and 1: {sorted(values)}"
    assert not y[p == 0].any(), "Bernoulli output is 1 where the probability is 0"
    assert y[p == 1].all(), "Bernoulli output is 0 where the probability is 1"
    _within_six_sigma(y.sum(), p.sum(), (p * (1 - p)).sum(), "number of ones")


def _optional(inputs, i):
    if len(inputs) <= i or inputs[i] is None or np.asarray(inputs[i]).size == 0:
        return None
    return np.asarray(inputs[i])


def _check_dropout(inputs, got, rtol, atol):
    x = np.asarray(inputs[0], np.float64)
    ratio = _optional(inputs, 1)
    ratio = 0.5 if ratio is None else float(ratio)
    training = _optional(inputs, 2)
    training = False if training is None else bool(training)
    y = got[0].astype(np.float64)
    mask = got[1] if len(got) > 1 else None
    if mask is not None:
        assert mask.dtype == np.bool_, f"Dropout mask dtype {mask.dtype}, expected bool"
    if not training or ratio == 0.0:
        np.testing.assert_allclose(y, x, rtol=rtol, atol=atol, err_msg="Dropout outside training")
        if mask is not None:
            assert mask.all(), "Dropout mask outside training must be all true"
        return
    scaled = x / (1.0 - ratio)
    if mask is not None:
        np.testing.assert_allclose(y, np.where(mask, scaled, 0.0), rtol=rtol, atol=atol,
                                   err_msg="Dropout output != x * mask / (1 - ratio)")
        kept = mask
    else:
        kept = np.isclose(y, scaled, rtol=rtol, atol=atol) & (scaled != 0)
        assert (kept | (y == 0)).all(), "Dropout output elements neither 0 nor x / (1 - ratio)"
    n = x.size
    _within_six_sigma(kept.sum(), n * (1 - ratio), n * ratio * (1 - ratio), "kept elements")


def _declared_dtype(value_info):
    from jaxort.dtypes import ONNX_TO_NUMPY

    t = value_info.type
    if not t.HasField("tensor_type"):
        return None
    return ONNX_TO_NUMPY.get(t.tensor_type.elem_type)


def _as_declared(x, dtype):
    """Test data of onnx < 1.17 holds bfloat16 as uint16, float8 as float32 or onnx's
    own structured dtypes, and some float outputs as float64; the graph's declared
    type is what a backend is checked against."""
    if dtype is None or not isinstance(x, np.ndarray) or x.dtype == dtype or dtype == object:
        return x
    same_bits = x.dtype.names is not None or (dtype.name == "bfloat16" and x.dtype == np.uint16)
    if same_bits and x.dtype.itemsize == dtype.itemsize:
        return x.view(dtype)
    return x.astype(dtype)


def _to_value(x):
    """Test data holds TensorProtos for types numpy lacks natively (float8, int4)."""
    import onnx
    from onnx import numpy_helper

    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, (list, tuple)):
        return [_to_value(v) for v in x]
    return x


def _outcome(case, op_type=None) -> tuple:
    """Runs one case; returns (passed, message), the message the first lines of the error.

    A :data:`RANDOM_OPS` case that fails by equality is run again under its
    properties; passing that way, its message is :data:`BY_PROPERTY`. ``op_type``
    is :func:`case_op_type` of the case, given by a caller whose index of the
    cases this process lacks (a worker).
    """
    try:
        run_case(case)
    except BaseException as e:  # report every failure, keep the run going
        if isinstance(e, KeyboardInterrupt):
            raise
        msg = _first_lines(e)
        if (op_type or case_op_type(case)) not in RANDOM_OPS:
            return False, msg
        try:
            run_case(case, by_property=True)
        except BaseException as e2:
            if isinstance(e2, KeyboardInterrupt):
                raise
            return False, f"{msg} (and by property: {_first_lines(e2)})"[:400]
        return True, BY_PROPERTY
    return True, ""


def _first_lines(e) -> str:
    msg = f"{type(e).__name__}: {e}".strip().splitlines()
    return " ".join(msg[:3])[:300]


def run_in_process(cases) -> dict:
    """Runs cases one after the other in this process; returns name -> (passed, message).

    The cheap way for cases known to finish (the core ops in the test suite):
    one JAX start-up for all of them, no case copied between processes. A case
    that hangs hangs the caller; :func:`run_all` isolates cases instead.
    """
    return {case.name: _outcome(case) for case in cases}


def _worker(conn):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        case, op_type = job
        conn.send((case.name, *_outcome(case, op_type)))


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        if not self.conn.poll(300):
            raise RuntimeError("conformance worker did not start")
        assert self.conn.recv() == "ready"
        self.case = None
        self.started = 0.0

    def kill(self):
        self.proc.kill()
        self.proc.join()


def run_all(cases, timeout: float, jobs: int, progress=True) -> dict:
    """Runs cases in ``jobs`` worker processes; returns name -> (passed, message).

    Each case is sent to a worker (cases pickle, so a worker never collects
    them itself) and must finish within ``timeout`` seconds; a worker that
    overruns or crashes is replaced and its case counts as failed.
    """
    ctx = mp.get_context("spawn")
    pending = collections.deque(cases)
    results = {}
    workers = [_Worker(ctx) for _ in range(max(1, jobs))]
    total = len(pending)
    try:
        while pending or any(w.case for w in workers):
            for i, w in enumerate(workers):
                if w.case is None and pending:
                    case = pending.popleft()
                    w.case = case.name
                    w.started = time.monotonic()
                    # The worker never collected the cases, so it gets the op type
                    # (an *_expanded case's is its base case's) with the case.
                    w.conn.send((case, case_op_type(case)))
                elif w.case is not None:
                    if w.conn.poll(0.01):
                        name, ok, msg = w.conn.recv()
                        results[name] = (ok, msg)
                        w.case = None
                        if progress and len(results) % 100 == 0:
                            print(f"  {len(results)}/{total}", file=sys.stderr, flush=True)
                    elif time.monotonic() - w.started > timeout or not w.proc.is_alive():
                        why = "timed out" if w.proc.is_alive() else "worker crashed"
                        results[w.case] = (False, f"{why} after {timeout:.0f} s limit"
                                           if why == "timed out" else why)
                        w.kill()
                        workers[i] = _Worker(ctx)
    finally:
        for w in workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.kill()
    return results


def main(argv=None) -> int:
    """Runs the cases the command line names; prints passed/total and failures by op."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated op types (default: every case); "
                        "'core' for the CORE_OPS")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes; 0 runs in this process, without time limits")
    parser.add_argument("--report", help="write a per-case result file here")
    args = parser.parse_args(argv)
    ops = args.ops.split(",") if args.ops else None
    if ops == ["core"]:
        ops = list(CORE_OPS)
    cases = collect_cases(ops)
    by_name = {c.name: case_op_type(c) for c in cases}
    t0 = time.monotonic()
    if args.jobs == 0:
        results = run_in_process(cases)
    else:
        results = run_all(cases, args.timeout, args.jobs)
    failed = collections.defaultdict(list)
    for name, (ok, msg) in sorted(results.items()):
        if not ok:
            failed[by_name[name]].append((name, msg))
    per_op = collections.Counter(by_name.values())
    passed = sum(ok for ok, _ in results.values())
    by_property = sorted(name for name, (ok, msg) in results.items() if ok and msg == BY_PROPERTY)
    strict = passed - len(by_property)
    print(f"\nfailures by op ({sum(map(len, failed.values()))} cases in {len(failed)} ops):")
    for op in sorted(failed):
        print(f"  {op}: {len(failed[op])}/{per_op[op]} failed")
        for name, msg in failed[op]:
            print(f"    {name}: {msg}")
    if args.report:
        with open(args.report, "w") as f:
            for name, (ok, msg) in sorted(results.items()):
                status = "PROPERTY" if ok and msg == BY_PROPERTY else "PASS" if ok else "FAIL"
                f.write(f"{by_name[name]}\t{name}\t{status}\t{msg}\n")
    if by_property:
        print(f"\n{BY_PROPERTY} ({len(by_property)} cases whose file holds numpy's draw):")
        for name in by_property:
            print(f"  {name}")
    total = max(1, len(results))
    print(f"\nconformance: {passed}/{len(results)} passed ({100.0 * passed / total:.1f}%), "
          f"of which {len(by_property)} random-op cases by property; "
          f"strict (outputs equal to the file): {strict}/{len(results)} "
          f"({100.0 * strict / total:.1f}%); in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
