"""Control flow: If, Loop and Scan.

Subgraphs (branches, bodies) are ``Subgraph`` callables that read the
enclosing graph's values by name; they are traced inside ``lax.cond``,
``lax.scan`` and ``lax.while_loop`` or, when the trip count and condition are
known at trace time, unrolled in Python so static shape arithmetic in the body
keeps folding. These ops are never folded as a whole.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError, StaticValueError
from jaxort.graph import register
from jaxort.graph.ops._common import canonical_dtype

# Loops with a static trip count up to this many iterations are unrolled in Python.
_UNROLL_MAX = 256
# Loops with a static trip count up to this many iterations and a run-time exit
# condition become a gated lax.scan (reverse-differentiable); longer ones a while_loop.
_GATED_SCAN_MAX = 1 << 16


def _concrete(x):
    """Returns ``x`` as numpy if it is known at trace time, else None."""
    if isinstance(x, (np.ndarray, np.generic, bool, int, float)):
        return np.asarray(x)
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        return np.asarray(x)
    return None


def _to_jax(tree):
    """Converts static leaves to JAX arrays (lax control flow returns arrays only)."""
    return jax.tree_util.tree_map(jnp.asarray, tree)


def _describe_types(tree) -> str:
    def one(x):
        if x is None:
            return "None"
        if isinstance(x, (list, tuple)):
            return "seq[" + ", ".join(one(v) for v in x) + "]"
        return f"{np.dtype(x.dtype).name}{list(jnp.shape(x))}"

    return "(" + ", ".join(one(v) for v in tree) + ")"


def _avals(tree):
    return jax.tree_util.tree_map(lambda x: (tuple(jnp.shape(x)), np.dtype(x.dtype)), tree)


# ---- If ----

@register("If", since=1, foldable=False)
def if_(cond, *, then_branch, else_branch):
    """If-1+; a static condition runs one branch, a traced one uses lax.cond."""
    c = _concrete(cond)
    if c is not None:
        if c.size != 1:
            raise OpError(f"cond must hold one element, given shape "
                          f"{list(c.shape)}")
        return then_branch() if bool(c.reshape(-1)[0]) else else_branch()
    then_shapes = jax.eval_shape(lambda: _to_jax(then_branch()))
    else_shapes = jax.eval_shape(lambda: _to_jax(else_branch()))
    if (jax.tree_util.tree_structure(then_shapes) != jax.tree_util.tree_structure(else_shapes)
            or _avals(then_shapes) != _avals(else_shapes)):
        raise StaticValueError(
            f"the condition is only known at run time and the branches "
            f"give different outputs (then {_describe_types(then_shapes)}, else "
            f"{_describe_types(else_shapes)}); jaxort compiles both branches with lax.cond, "
            "which needs equal shapes and dtypes")
    pred = jnp.reshape(cond, ()).astype(bool)
    return jax.lax.cond(pred, lambda: _to_jax(then_branch()), lambda: _to_jax(else_branch()))


# ---- Loop ----

class _LeaveUnroll(Exception):
    """The unrolled loop met a traced condition; retry with lax control flow."""


class _CondNotStatic(Exception):
    """Inside lax.scan the body's condition output is not statically true."""


def _stack(values):
    if all(_concrete(v) is not None and isinstance(v, (np.ndarray, np.generic)) for v in values):
        return np.stack([np.asarray(v) for v in values])
    return jnp.stack([jnp.asarray(v) for v in values])


def _empty_scan_outputs(body, n_carried, carried):
    """Scan outputs of a loop that ran zero times: shape (0, *element shape)."""
    def run(*c):
        outs = body(np.asarray(0, np.int64), np.asarray(True), *c)
        return _to_jax(outs[1 + n_carried:])

    shapes = jax.eval_shape(run, *carried)
    return [np.zeros((0,) + tuple(s.shape), s.dtype) for s in shapes]


def _loop_unrolled(body, trip, cond, carried, n_carried, n_scan, limit):
    """Runs the loop in Python; raises _LeaveUnroll if it cannot stay static."""
    scans = [[] for _ in range(n_scan)]
    i = 0
    c = True if cond is None else bool(cond.reshape(-1)[0])
    carried = list(carried)
    while c and (trip is None or i < trip):
        if i >= limit:
            raise _LeaveUnroll()
        outs = body(np.asarray(i, np.int64), np.asarray(c), *carried)
        cond_out = _concrete(outs[0])
        carried = list(outs[1:1 + n_carried])
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        i += 1
        if cond_out is None:
            raise _LeaveUnroll()
        c = bool(cond_out.reshape(-1)[0])
    if n_scan and i == 0:
        scan_outs = _empty_scan_outputs(body, n_carried, carried)
    else:
        scan_outs = [_stack(s) for s in scans]
    return tuple(carried) + tuple(scan_outs)


def _check_carry(init, new, what):
    """Casts ``new`` to ``init``'s dtype; errors when the shape changes."""
    out = []
    for k, (a, b) in enumerate(zip(init, new)):
        if isinstance(a, (list, tuple)) or a is None or isinstance(b, (list, tuple)) or b is None:
            raise StaticValueError(
                f"{what} {k} is a sequence or optional; jaxort can only "
                "carry those through loops it unrolls (static trip count and condition)")
        if tuple(jnp.shape(a)) != tuple(jnp.shape(b)):
            raise OpError(
                f"{what} {k} changes shape from {list(jnp.shape(a))} to "
                f"{list(jnp.shape(b))} inside the loop; jaxort compiles loops with lax "
                "control flow, which needs fixed shapes (or a static trip count <= "
                f"{_UNROLL_MAX})")
        out.append(jnp.asarray(b).astype(jnp.asarray(a).dtype))
    return tuple(out)


def _while(body, m, cond, init, n_carried):
    """lax.while_loop over (i, cond, carried); ``m`` is None, an int or a traced scalar."""
    index_dtype = canonical_dtype(np.int64)
    if m is not None:
        m = jnp.reshape(jnp.asarray(m), ()).astype(index_dtype)

    def cond_fn(state):
        i, c, _ = state
        return c if m is None else c & (i < m)

    def body_fn(state):
        i, c, carry = state
        outs = body(i, c, *carry)
        new = _check_carry(carry, outs[1:1 + n_carried], "loop-carried value")
        return i + 1, jnp.reshape(jnp.asarray(outs[0]), ()).astype(bool), new

    start = jnp.asarray(True) if cond is None else jnp.reshape(cond, ()).astype(bool)
    _, _, final = jax.lax.while_loop(cond_fn, body_fn,
                                     (jnp.asarray(0, index_dtype), start, init))
    return tuple(final)


def _loop_traced(body, m, cond, carried, n_carried, n_scan):
    """Loop through lax.scan (static trip count) or lax.while_loop."""
    index_dtype = canonical_dtype(np.int64)
    init = tuple(jnp.asarray(v) if not isinstance(v, (list, tuple)) and v is not None else v
                 for v in carried)
    _check_carry(init, init, "loop-carried value")
    trip = m if isinstance(m, int) else None
    cond_static = None if cond is None else _concrete(cond)
    always_true = cond is None or (cond_static is not None and bool(cond_static.reshape(-1)[0]))
    if cond_static is not None and not always_true:
        # The loop does not run at all.
        if n_scan:
            return tuple(carried) + tuple(_empty_scan_outputs(body, n_carried, carried))
        return tuple(carried)

    if trip is not None and always_true:
        # A plain scan if the body's condition output stays statically true.
        def step(state, _):
            i, carry = state
            outs = body(i, np.asarray(True), *carry)
            c = _concrete(outs[0])
            if c is None or not bool(c.reshape(-1)[0]):
                raise _CondNotStatic()
            new = _check_carry(carry, outs[1:1 + n_carried], "loop-carried value")
            return (i + 1, new), _to_jax(tuple(outs[1 + n_carried:]))

        try:
            (_, final), ys = jax.lax.scan(step, (jnp.asarray(0, index_dtype), init), None,
                                          length=trip)
            return tuple(final) + tuple(ys)
        except _CondNotStatic:
            pass

    if n_scan:
        raise StaticValueError(
            "a Loop with scan outputs needs a trip count and a condition "
            "known at trace time (the number of stacked iterations decides the output shape)")

    if trip is not None and trip <= _GATED_SCAN_MAX:
        # Static trip count, run-time exit: a gated scan (reverse-differentiable).
        def gated(state, _):
            i, active, carry = state

            def run(carry):
                outs = body(i, np.asarray(True), *carry)
                new = _check_carry(carry, outs[1:1 + n_carried], "loop-carried value")
                return jnp.reshape(jnp.asarray(outs[0]), ()).astype(bool), new

            c, new = jax.lax.cond(active, run, lambda carry: (jnp.asarray(False), carry), carry)
            return (i + 1, active & c, new), None

        start = jnp.asarray(True) if cond is None else jnp.reshape(cond, ()).astype(bool)
        (_, _, final), _ = jax.lax.scan(
            gated, (jnp.asarray(0, index_dtype), start, init), None, length=trip)
        return tuple(final)

    # Run-time trip count or exit: lax.while_loop (forward-mode differentiable only).
    return _while(body, m, cond, init, n_carried)


@register("Loop", since=1, foldable=False)
def loop(M=None, cond=None, *v_initial, body):  # noqa: N803 (spec name)
    """Loop-1+; unrolled when trip count and condition are static, else lax.scan/while_loop.

    A run-time trip count or exit with scan outputs raises StaticValueError
    (output shapes would depend on data); lax.while_loop loops (run-time trip
    count) support only forward-mode differentiation.
    """
    n_carried = len(v_initial)
    n_scan = len(body.output_names) - 1 - n_carried
    if n_scan < 0:
        raise OpError(f"the body has {len(body.output_names)} outputs, "
                      f"fewer than 1 + {n_carried} loop-carried values")
    m_static = None if M is None else _concrete(M)
    cond_static = None if cond is None else _concrete(cond)
    if M is not None and m_static is None:
        return _loop_traced(body, M, cond, v_initial, n_carried, n_scan)
    trip = None if m_static is None else int(m_static.reshape(-1)[0])
    if trip is None and cond is None:
        raise OpError("Loop has neither a trip count nor a condition")
    if (cond is None or cond_static is not None) and (trip is None or trip <= _UNROLL_MAX):
        try:
            return _loop_unrolled(body, trip, cond_static, v_initial, n_carried, n_scan,
                                  _UNROLL_MAX)
        except _LeaveUnroll:
            pass
    return _loop_traced(body, trip, cond, v_initial, n_carried, n_scan)


# ---- Scan ----

def _norm_axis(axis, rank, what):
    if not -rank <= axis < rank:
        raise OpError(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def _scan(body, states, xs, in_axes, in_dirs, out_axes, out_dirs):
    n_state = len(states)
    n_out = len(body.output_names) - n_state
    if n_out < 0:
        raise OpError(f"the body has {len(body.output_names)} outputs, "
                      f"fewer than its {n_state} state variables")
    in_axes = list(in_axes) if in_axes is not None else [0] * len(xs)
    in_dirs = list(in_dirs) if in_dirs is not None else [0] * len(xs)
    out_axes = list(out_axes) if out_axes is not None else [0] * n_out
    out_dirs = list(out_dirs) if out_dirs is not None else [0] * n_out
    seqs = []
    for k, x in enumerate(xs):
        x = jnp.asarray(x)
        ax = _norm_axis(int(in_axes[k]), x.ndim, "scan_input_axes entry")
        x = jnp.moveaxis(x, ax, 0)
        if in_dirs[k]:
            x = jnp.flip(x, 0)
        seqs.append(x)
    lengths = {int(x.shape[0]) for x in seqs}
    if len(lengths) > 1:
        raise OpError(f"scan inputs have different sequence lengths "
                      f"{sorted(lengths)}")
    init = tuple(jnp.asarray(s) for s in states)

    def step(state, x):
        outs = body(*state, *x)
        new = []
        for k, (a, b) in enumerate(zip(state, outs[:n_state])):
            if tuple(jnp.shape(a)) != tuple(jnp.shape(b)):
                raise OpError(f"state variable {k} changes shape from "
                              f"{list(jnp.shape(a))} to {list(jnp.shape(b))}")
            new.append(jnp.asarray(b).astype(a.dtype))
        return tuple(new), _to_jax(tuple(outs[n_state:]))

    length = lengths.pop() if lengths else None
    if length is None:
        raise OpError("Scan needs at least one scan input")
    final, ys = jax.lax.scan(step, init, tuple(seqs), length=length)
    outs = []
    for k, y in enumerate(ys):
        if out_dirs[k]:
            y = jnp.flip(y, 0)
        ax = _norm_axis(int(out_axes[k]), y.ndim, "scan_output_axes entry")
        outs.append(jnp.moveaxis(y, 0, ax))
    return tuple(final) + tuple(outs)


@register("Scan", since=9, foldable=False)
def scan(*initial_state_and_scan_inputs, body, num_scan_inputs, scan_input_axes=None,
         scan_input_directions=None, scan_output_axes=None, scan_output_directions=None):
    """Scan-9+ through lax.scan."""
    args = initial_state_and_scan_inputs
    n_state = len(args) - num_scan_inputs
    return _scan(body, args[:n_state], args[n_state:], scan_input_axes, scan_input_directions,
                 scan_output_axes, scan_output_directions)


@register("Scan", since=8, foldable=False)
def scan_8(sequence_lens=None, *initial_state_and_scan_inputs, body, num_scan_inputs,
           directions=None):
    """Scan-8 (batch axis 0) through vmap of lax.scan; sequence_lens must be the full length."""
    args = initial_state_and_scan_inputs
    n_state = len(args) - num_scan_inputs
    if sequence_lens is not None:
        lens = _concrete(sequence_lens)
        if lens is None:
            raise StaticValueError("input 'sequence_lens' must be known at "
                                   "trace time")
        full = {int(jnp.shape(x)[1]) for x in args[n_state:]}
        if any(int(v) not in full for v in lens.reshape(-1)):
            raise OpError(f"sequence_lens {lens.tolist()} shorter than the "
                          "scan inputs are not supported")

    def one(*row):
        return _scan(body, row[:n_state], row[n_state:], None, directions, None, None)

    return jax.vmap(one)(*[jnp.asarray(a) for a in args])
