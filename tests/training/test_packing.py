"""Packed training states: the same values in fewer buffers, and steps that give the same numbers."""

from __future__ import annotations


import jax
import numpy as np
import pytest

from jaxort import checkpoint as ckpt
from jaxort.api import CheckpointState, Module, Optimizer
from jaxort.errors import TrainingError
from jaxort.training import TrainProgram, TrainState
from jaxort.training.packing import PackedState, Packing, pack, unpack

# Device-sensitive: `make gpu-check` runs these on an accelerator.
pytestmark = pytest.mark.accelerator


def _golden(golden, case):
    program, start, batches, folder = golden(case)
    return program, start, list(zip(batches["train::input"], batches["train::labels"])), folder


def _assert_same(a: TrainState, b: TrainState, rtol: float = 0.0):
    """Equal trees, leaf by leaf: same shapes, dtypes and values (floats within ``rtol``)."""
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        if rtol and x.dtype.kind == "f":
            # Sums that cancel (gradients) round at the scale of their terms.
            np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * float(np.abs(y).max(initial=0.0)))
        else:
            np.testing.assert_array_equal(x, y)


# Packing changes which operations XLA fuses, and how it calls the matrix
# products (their operands are slices of the packed buffer): sums may be
# taken in another order and multiply-adds contracted in one program and not
# the other, so results may differ at float32 rounding.
ROUNDING = 4 * float(np.finfo(np.float32).eps)


def test_small_leaves_share_one_buffer_per_dtype_and_large_ones_stay(golden):
    program, start, _, _ = _golden(golden, "mlp_adamw")
    state = program.init_state(start)
    sizes = sorted({int(np.size(x)) for x in jax.tree.leaves(state)})
    limit = sizes[-2]  # the largest leaves stay loose, the rest is packed
    packing = Packing.of(state, max_elements=limit)
    packed = pack(state, packing)
    leaves = jax.tree.leaves(state)
    loose = [x for x in leaves if np.size(x) > limit]
    assert loose and len(packed.loose) == len(loose)
    assert all(p is x for p, x in zip(packed.loose, loose))  # shared, not copied
    expected = {}
    for x in leaves:
        if np.size(x) <= limit:
            expected[np.dtype(x.dtype)] = expected.get(np.dtype(x.dtype), 0) + int(np.size(x))
    assert dict(packing.groups) == expected
    assert [b.shape for b in packed.buffers] == [(n,) for n in expected.values()]
    assert packing.packed_leaves == len(leaves) - len(loose)
    _assert_same(unpack(packed), state)
    assert unpack(packed) is unpack(packed)  # read once per state


@pytest.mark.parametrize("case,all_packed,by_role", [
    ("mlp_adamw", False, False), ("mlp_adamw", True, False), ("mlp_sgd", True, False),
    ("mlp_adamw", False, True), ("mlp_adamw", True, True), ("mlp_sgd", True, True)])
def test_steps_on_a_packed_state_give_the_numbers_of_the_state(case, all_packed, by_role, golden):
    # Every step a facade runs, on both forms from the same start. A packing
    # with a loose leaf covers both kinds of leaf and updates tensor by
    # tensor; with every leaf packed, the optimizer updates all parameters
    # as one vector (contiguous in the buffer, shared or the parameters' own).
    program, start, batches, _ = _golden(golden, case)
    state = program.init_state(start)
    sizes = sorted({int(np.size(x)) for x in jax.tree.leaves(state)})
    packing = Packing.of(state, max_elements=sizes[-1] if all_packed else sizes[-2],
                         role_elements=0 if by_role else 1 << 62)
    roles = 3 if program.optimizer.optimizer_type == "AdamW" else 1  # params, and Adam's two moments
    assert len(packing.groups) == len({np.dtype(x.dtype) for x in jax.tree.leaves(state)}) + (
        roles if by_role else 0)
    assert program.flat_update_applies(packing) == all_packed
    packed = pack(program.init_state(start), packing)
    (x0, y0), (x1, y1), (x2, y2) = batches[:3]

    calls = [
        lambda s: program.train_step_after(s, x0, y0),
        lambda s: program.train_step_after(s, x1, y1, optimizer_step=True, reset_grad=True),
        lambda s: program.train_step_after(s, x2, y2, optimizer_step=True, learning_rate=0.01),
        lambda s: program.train_step(s, x0, y0),
        lambda s: program.optimizer_step(s),
        lambda s: program.lazy_reset_grad(s),
        lambda s: program.train_and_update(s, x1, y1),
    ]
    for i, call in enumerate(calls):
        out_s, out_p = call(state), call(packed)
        if isinstance(out_s, tuple):
            (state, outs_s), (packed, outs_p) = out_s, out_p
            np.testing.assert_allclose(np.asarray(outs_p[0]), np.asarray(outs_s[0]), rtol=ROUNDING)
        else:
            state, packed = out_s, out_p
        assert isinstance(packed, PackedState) and packed.packing == packing, f"call {i}"
        _assert_same(unpack(packed), state, rtol=ROUNDING)
        np.testing.assert_allclose(np.asarray(program.eval_step(packed, x2, y2)[0]),
                                   np.asarray(program.eval_step(state, x2, y2)[0]), rtol=ROUNDING)
    assert int(state.step) == 4


def test_parameters_and_moments_get_buffers_of_their_own_when_many(golden):
    program, start, _, _ = _golden(golden, "mlp_adamw")
    state = program.init_state(start)
    n_params = sum(int(np.size(x)) for x in jax.tree.leaves(state.params))
    few, many = Packing.of(state, role_elements=n_params + 1), Packing.of(state, role_elements=n_params)
    assert len(few.groups) == len({np.dtype(x.dtype) for x in jax.tree.leaves(state)})
    # The parameters, then Adam's two moments, each a float32 buffer of the
    # parameters' size; gradients, counters and the rest share their dtype's.
    own = [size for dtype, size in many.groups if size == n_params and dtype == np.float32]
    assert len(many.groups) == len(few.groups) + 3 and len(own) >= 3
    packed = pack(state, many)
    _assert_same(unpack(packed), state)
    slots = jax.tree.unflatten(many.treedef, list(many.slots))
    assert len({slots.params[n][0] for n in slots.params}) == 1
    assert slots.params[next(iter(slots.params))][0] != slots.grads[next(iter(slots.grads))][0]


def test_training_mode_batch_norm_writes_its_statistics_into_a_packed_state(models):
    rng = np.random.default_rng(0)
    params = {"scale": rng.standard_normal(3).astype(np.float32), "bias": np.zeros(3, np.float32),
              "mean": np.zeros(3, np.float32), "var": np.ones(3, np.float32)}
    model = models.bn_model(3, 0.9, 1e-5, params)
    start = ckpt.Checkpoint(trainable={n: params[n] for n in ("scale", "bias")},
                            frozen={n: params[n] for n in ("mean", "var")})
    program = TrainProgram.from_artifacts(model, checkpoint=start)
    state = program.init_state(start)
    packed = pack(program.init_state(start))
    x = rng.standard_normal((8, 3, 4, 4)).astype(np.float32)
    state, _ = program.train_step(state, x)
    packed, _ = program.train_step(packed, x)
    _assert_same(unpack(packed), state, rtol=ROUNDING)
    batch_mean = x.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(np.asarray(unpack(packed).frozen["mean"]), 0.1 * batch_mean, rtol=1e-5, atol=1e-7)


def test_a_state_that_does_not_fit_the_packing_is_refused(golden):
    program, start, _, _ = _golden(golden, "mlp_adamw")
    state = program.init_state(start)
    packing = Packing.of(state)
    with pytest.raises(TrainingError, match="structure"):
        pack(state.replace(opt_state=()), packing)
    name = next(iter(state.params))
    bad = state.replace(params={**state.params, name: state.params[name][:1]})
    with pytest.raises(TrainingError, match=r"cannot pack a leaf of shape \[1"):
        pack(bad, packing)


def test_a_packed_state_is_immutable_and_pickles_to_the_same_values(golden):
    import pickle

    program, start, _, _ = _golden(golden, "mlp_adamw")
    packed = pack(program.init_state(start))
    with pytest.raises(AttributeError, match="immutable"):
        packed.buffers = ()
    with pytest.raises(AttributeError, match="immutable"):
        del packed.loose
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        packed.nonsense
    again = pickle.loads(pickle.dumps(packed))
    assert again.packing == packed.packing
    _assert_same(unpack(again), unpack(packed))


def test_a_packed_state_reads_and_changes_like_the_train_state_it_holds(golden):
    from jaxort.training import (apply_schedule, linear_lr_schedule, make_mesh, set_initial_learning_rate,
                                 set_learning_rate, set_seed, shard)

    program, start, batches, _ = _golden(golden, "mlp_adamw")
    state = program.init_state(start)
    packed = pack(state)
    for field in ("params", "frozen", "grads", "accumulate", "opt_state", "learning_rate",
                  "initial_learning_rate", "rng", "parameters", "step"):
        _assert_same(getattr(packed, field), getattr(state, field))
    # The values of ORT's checkpoint, read through the packed state.
    assert sorted(packed.params) == sorted(start.trainable)
    for name, value in start.trainable.items():
        np.testing.assert_array_equal(packed.params[name], value)

    for change in (lambda s: set_learning_rate(s, 0.05), lambda s: set_initial_learning_rate(s, 0.02),
                   lambda s: set_seed(s, 7), lambda s: apply_schedule(s, linear_lr_schedule(0.1, 2, 10))):
        changed = change(packed)
        assert isinstance(changed, PackedState) and changed.packing == packed.packing
        _assert_same(unpack(changed), change(state))
    # Values that fit are written into copies of their buffers; the rest is shared.
    bumped = jax.tree.map(lambda x: x + 1, state.params)
    changed = packed.replace(params=bumped)
    assert changed.packing == packed.packing
    _assert_same(unpack(changed), state.replace(params=bumped))
    sizes = sorted({int(np.size(x)) for x in jax.tree.leaves(state)})
    partly = pack(state, Packing.of(state, max_elements=sizes[-2]))
    changed = set_learning_rate(partly, 0.5)
    assert partly.loose and all(a is b for a, b in zip(changed.loose, partly.loose))
    assert float(changed.learning_rate) == 0.5
    with pytest.raises(TypeError, match="no field 'lr'"):
        packed.replace(lr=0.1)
    # A change of structure packs anew.
    bare = packed.replace(opt_state=())
    assert isinstance(bare, PackedState) and bare.packing != packed.packing
    _assert_same(unpack(bare), state.replace(opt_state=()))

    got = program.to_checkpoint(packed, include_optimizer_state=True)
    assert ckpt.to_bytes(got) == ckpt.to_bytes(program.to_checkpoint(state, include_optimizer_state=True))
    for name, value in start.trainable.items():
        np.testing.assert_array_equal(got.trainable[name], value)
    # lazy_reset_grad does not donate the packed state it is given (nor a TrainState).
    trained, _ = program.train_step(pack(program.init_state(start)), *batches[0])
    reset = program.lazy_reset_grad(trained)
    assert bool(trained.accumulate) and not bool(reset.accumulate)
    _assert_same(unpack(reset), unpack(trained).replace(accumulate=np.zeros((), np.bool_)))
    assert [np.asarray(b).shape for b in trained.buffers] == [np.asarray(b).shape for b in reset.buffers]
    # Steps on a mesh take the TrainState: shard unpacks.
    placed = shard(packed, make_mesh())
    assert isinstance(placed, TrainState)
    _assert_same(placed, state)

def test_the_facades_train_packed_and_read_the_same_values(golden):
    # jaxort.api's loop trains on a packed state; what it reads and saves is
    # what the functional core computes on the plain state.
    program, start, batches, folder = _golden(golden, "mlp_adamw")
    state = CheckpointState.load_checkpoint(str(folder / "checkpoint"))
    module = Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"))
    optimizer = Optimizer(str(folder / "optimizer_model.onnx"), module)
    core = program.init_state(start)
    for i, (x, y) in enumerate(batches[:3]):
        loss = module(x, y)
        core, (want,) = program.train_step(core, x, y)
        np.testing.assert_allclose(loss, np.asarray(want), rtol=ROUNDING)
        if i == 0:  # nothing deferred yet: the state is as the train step left it
            assert isinstance(state.session_state.train, PackedState)
        optimizer.step()
        module.lazy_reset_grad()
        core = program.lazy_reset_grad(program.optimizer_step(core))
    values = module.get_contiguous_parameters().numpy()
    want = np.concatenate([np.asarray(core.params[n]).ravel() for n in program.layout.buffer_names(True)])
    np.testing.assert_allclose(values, want, rtol=ROUNDING)
