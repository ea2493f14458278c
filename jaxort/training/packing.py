"""Packed training states: a TrainState's small leaves in a few buffers (one per dtype, or per role).

A compiled step pays for every buffer it takes and returns, whatever the
arithmetic: on XLA's CPU runtime about 0.3 us per input and 1.2 us per
output (jax 0.10, measured on a 2-core x86-64 machine), and one optimizer
update per tensor. A 20-16-5 MLP's state (parameters, gradient
accumulators, two Adam moments, counters) is 21 buffers, so buffer
bookkeeping alone costs more than its forward and backward passes;
ResNet-18's is some 300.

A :class:`PackedState` holds the same values with every leaf of at most
``max_elements`` elements concatenated, flattened, into one 1-D buffer per
dtype; larger leaves stay as they are (copying them in and out would cost
more than their bookkeeping). A step over a packed state unpacks it with
slices inside the compiled program and packs its result with one
concatenation per buffer. Values are unchanged: slicing and concatenating
are exact.

When the packed parameters are many (at least ``role_elements`` values),
the parameters and each optimizer-state tree of per-parameter tensors (Adam's
moments) get a buffer of their own instead of a share of their dtype's: the
optimizer then writes each of them whole, where the shared buffer made the
step copy them into a concatenation with the gradients (BERT-tiny, 114k
parameters: 1240 -> 1161 us a step on one core). For few parameters the
three extra buffers cost more than the copy saves (ResNet-18 at widths 3-24,
26k parameters: 1308 -> 1334 us; the 20-16-5 MLP: 72 -> 76 us).

:class:`jaxort.training.TrainProgram`'s steps take either form and return
the form they were given; a packed state reads and changes like the
TrainState it holds (:class:`PackedState`). The session facades train on
packed states and unpack them only to read values. Layer: training (imports
nothing above it).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import TrainingError
from jaxort.training.state import STATE_FIELDS, TrainState

__all__ = ["Packing", "PackedState", "Slot", "PACK_MAX_ELEMENTS", "pack", "unpack", "cleared"]

# Leaves of at most this many elements are packed. Above it, a leaf's
# copies into and out of the packed buffer (a slice before a matrix
# product, a concatenation after its gradient) cost more than the ~1.5 us
# of bookkeeping it saves as a buffer of its own.
PACK_MAX_ELEMENTS = 1 << 14
# With at least this many packed parameter values, the parameters and each
# per-parameter optimizer-state tree get buffers of their own (module docstring).
ROLE_MIN_ELEMENTS = 1 << 16


class Slot(NamedTuple):
    """Where one leaf of a TrainState lives in a :class:`PackedState`.

    Attributes:
      group: the packed buffer holding it, or -1 for a leaf kept as it is.
      offset: its first element in the buffer (for a loose leaf: its index
        among the loose leaves).
      shape: its shape.
      dtype: its dtype.
    """

    group: int
    offset: int
    shape: tuple
    dtype: np.dtype

    @property
    def packed(self) -> bool:
        """Whether the leaf shares a packed buffer."""
        return self.group >= 0


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where each leaf of a TrainState lives in a :class:`PackedState` (static and hashable).

    Attributes:
      treedef: the state's tree structure.
      slots: one :class:`Slot` per leaf, in leaf order.
      groups: one per packed buffer: ``(dtype, size)``.
    """

    treedef: Any
    slots: tuple
    groups: tuple
    # Steps look their compiled program up by packing on every call: hash once.
    _hash: int = dataclasses.field(default=0, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.treedef, self.slots, self.groups)))

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        sizes = ", ".join(f"{dtype}[{size}]" for dtype, size in self.groups)
        return f"Packing(leaves={len(self.slots)}, packed=[{sizes}], loose={len(self.slots) - self.packed_leaves})"

    @classmethod
    def of(cls, state: TrainState, max_elements: int = PACK_MAX_ELEMENTS,
           role_elements: int = ROLE_MIN_ELEMENTS) -> "Packing":
        """The packing of ``state``: leaves of at most ``max_elements`` elements grouped by dtype.

        Args:
          state: a TrainState (arrays or shape-dtype structs).
          max_elements: the largest leaf that is packed.
          role_elements: with at least this many packed parameter values,
            the parameters and each optimizer-state tree of per-parameter
            tensors are packed in buffers of their own (module docstring).

        Returns:
          The packing.
        """
        flat, treedef = jax.tree_util.tree_flatten_with_path(state)
        sizes = [int(np.prod(np.shape(leaf), dtype=np.int64)) for _, leaf in flat]
        packed_params = sum(size for (path, _), size in zip(flat, sizes)
                            if size <= max_elements and _field(path) == "params")
        by_role = packed_params >= role_elements
        groups: dict = {}
        slots = []
        loose = 0
        for (path, leaf), size in zip(flat, sizes):
            shape, dtype = tuple(np.shape(leaf)), np.dtype(leaf.dtype)
            if size > max_elements:
                slots.append(Slot(-1, loose, shape, dtype))
                loose += 1
                continue
            key = (_role(path) if by_role else None, dtype)
            index, used = groups.get(key, (len(groups), 0))
            slots.append(Slot(index, used, shape, dtype))
            groups[key] = (index, used + size)
        ordered = sorted(groups.items(), key=lambda item: item[1][0])
        return cls(treedef=treedef, slots=tuple(slots),
                   groups=tuple((dtype, size) for (_, dtype), (_, size) in ordered))

    @property
    def packed_leaves(self) -> int:
        """How many leaves share the packed buffers."""
        return sum(1 for slot in self.slots if slot.packed)

    def pack(self, state: TrainState) -> "PackedState":
        """``state`` packed; a pure function of arrays (call it inside ``jit``; outside, :func:`pack`).

        Raises:
          TrainingError: ``state`` does not have this packing's structure,
            shapes and dtypes.
        """
        parts, loose = self._grouped(state)
        return PackedState(_join(parts), loose, self)

    def unpack(self, packed: "PackedState") -> TrainState:
        """The TrainState ``packed`` holds; a pure function of arrays (outside ``jit``, :func:`unpack`)."""
        return self._assemble(_pieces(packed.buffers, self._small_slots), packed.loose)

    def slot_tree(self) -> TrainState:
        """The slots arranged as the state they describe: a TrainState whose leaves are :class:`Slot` s."""
        return _slot_tree(self)

    def lies_flat(self, trees: Sequence[Any]) -> bool:
        """Whether the leaves of each of ``trees`` (subtrees of :meth:`slot_tree`) lie flat and alike.

        True when every leaf is packed float32, each tree's leaves lie
        contiguous in one buffer in the trees' common key order, and all the
        trees have the same sizes: then the concatenation of each tree is a
        slice of its buffer (what :func:`jaxort.training.optimizers.flat_update` wants).
        """
        runs = []
        for tree in trees:
            leaves = jax.tree.leaves(tree, is_leaf=_is_slot)
            if not leaves or any(not s.packed or np.dtype(s.dtype) != np.float32 for s in leaves):
                return False
            if len({s.group for s in leaves}) != 1:
                return False
            sizes = [math.prod(s.shape) for s in leaves]
            offsets = [s.offset for s in leaves]
            if offsets != (offsets[0] + np.cumsum([0] + sizes[:-1], dtype=np.int64)).tolist():
                return False
            runs.append(sizes)
        return all(run == runs[0] for run in runs)

    @property
    def _small_slots(self) -> tuple:
        return tuple((s.group, s.offset, s.shape) for s in self.slots if s.packed)

    def _grouped(self, state: TrainState) -> tuple[list, tuple]:
        """The packed leaves of ``state`` per group, and its loose leaves, checked against the slots."""
        leaves, treedef = jax.tree.flatten(state)
        if treedef != self.treedef:
            raise TrainingError(f"cannot pack a state of structure {treedef} with a packing made for "
                                f"{self.treedef}")
        parts: list = [[] for _ in self.groups]
        loose = []
        for leaf, (group, _, shape, dtype) in zip(leaves, self.slots):
            if tuple(np.shape(leaf)) != shape or np.dtype(leaf.dtype) != dtype:
                raise TrainingError(f"cannot pack a leaf of shape {list(np.shape(leaf))} dtype "
                                    f"{np.dtype(leaf.dtype)} into a slot of shape {list(shape)} dtype {dtype}")
            (loose if group < 0 else parts[group]).append(leaf)
        return parts, tuple(loose)

    def _assemble(self, pieces, loose) -> TrainState:
        pieces = iter(pieces)
        leaves = [next(pieces) if s.packed else loose[s.offset] for s in self.slots]
        return jax.tree.unflatten(self.treedef, leaves)


def _field(path) -> str | None:
    """The TrainState field a leaf's tree path starts in."""
    return getattr(path[0], "name", None) if path else None


def _role(path) -> str | None:
    """The tree a leaf is one parameter's entry of (the parameters, an optimizer moment), else None.

    Such trees are dicts keyed by parameter name under ``params`` or
    ``opt_state``; gradients, frozen values and counters share a buffer.
    """
    if _field(path) in ("params", "opt_state") and isinstance(path[-1], jax.tree_util.DictKey):
        return jax.tree_util.keystr(path[:-1])
    return None


def _join(parts) -> tuple:
    return tuple(jnp.concatenate([jnp.ravel(x) for x in p]) for p in parts)


def _pieces(buffers, slots) -> list:
    return [jax.lax.slice(buffers[g], (o,), (o + math.prod(s),)).reshape(s) for g, o, s in slots]


def _write(buffer, offsets, values):
    for offset, x in zip(offsets, values):
        buffer = jax.lax.dynamic_update_slice(buffer, jnp.ravel(x).astype(buffer.dtype), (offset,))
    return buffer


_join_jit = jax.jit(_join)
_pieces_jit = jax.jit(_pieces, static_argnums=1)
_write_jit = jax.jit(_write, static_argnums=1)


def _is_slot(x) -> bool:
    return isinstance(x, Slot)


@functools.lru_cache(maxsize=64)
def _slot_tree(packing: Packing) -> TrainState:
    return jax.tree.unflatten(packing.treedef, list(packing.slots))


class PackedState:
    """A TrainState with its small leaves packed (see the module docstring); a JAX pytree.

    It reads and changes like the TrainState it holds: the fields and
    properties of :class:`TrainState` (``params``, ``grads``,
    ``learning_rate``, ``step``, ...) are that state's (:func:`unpack`), and
    :meth:`replace` returns a packed state. So the state helpers
    (``set_learning_rate``, ``set_seed``, ``apply_schedule``, ...) and
    ``TrainProgram.to_checkpoint`` take either form.

    Attributes:
      buffers: the packed buffers, one 1-D array per entry ``(dtype, size)`` of ``packing.groups``.
      loose: the leaves kept as they are, in leaf order.
      packing: the static :class:`Packing`.
    """

    # A slotted class rather than a frozen dataclass: every compiled step
    # builds one when JAX unflattens its output, and a frozen dataclass's
    # __init__ costs a microsecond there (its object.__setattr__ calls).
    __slots__ = ("buffers", "loose", "packing", "__weakref__")

    def __init__(self, buffers: tuple, loose: tuple, packing: Packing):
        _SET_BUFFERS(self, buffers)
        _SET_LOOSE(self, loose)
        _SET_PACKING(self, packing)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a PackedState is immutable: use replace() to change {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a PackedState is immutable: {name!r} cannot be deleted")

    def __reduce__(self):
        return PackedState, (self.buffers, self.loose, self.packing)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{dtype}[{size}]" for dtype, size in self.packing.groups)
        return f"PackedState(packed=[{sizes}], loose={len(self.loose)})"

    def __getattr__(self, name: str):
        # Called only for names the packed state lacks: TrainState's fields
        # and properties read through the held state.
        if name in READABLE:
            return getattr(unpack(self), name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def replace(self, **changes) -> "PackedState":
        """:meth:`TrainState.replace` of the state held, packed.

        Values that fit their fields' slots (same structure, shapes and
        dtypes) are written into a copy of their buffers, the rest of the
        state is shared; any other change packs the changed state anew.
        Nothing is donated.
        """
        slots = self.packing.slot_tree()
        buffers, loose = list(self.buffers), list(self.loose)
        writes: dict = {}
        for name, value in changes.items():
            if name not in STATE_FIELDS:
                raise TypeError(f"TrainState has no field {name!r}")
            leaves, tree = jax.tree.flatten(value)
            wanted, wanted_tree = jax.tree.flatten(getattr(slots, name), is_leaf=_is_slot)
            if tree != wanted_tree or any(
                    tuple(np.shape(x)) != slot.shape or np.dtype(getattr(x, "dtype", None)) != slot.dtype
                    for x, slot in zip(leaves, wanted)):
                return pack(unpack(self).replace(**changes))
            for x, slot in zip(leaves, wanted):
                if slot.packed:
                    writes.setdefault(slot.group, []).append((slot.offset, x))
                else:
                    loose[slot.offset] = x
        for group, pairs in writes.items():
            buffers[group] = _write_jit(buffers[group], tuple(o for o, _ in pairs), tuple(x for _, x in pairs))
        return PackedState(tuple(buffers), tuple(loose), self.packing)


_SET_BUFFERS, _SET_LOOSE, _SET_PACKING = (vars(PackedState)[name].__set__ for name in ("buffers", "loose", "packing"))

# What a PackedState reads through the TrainState it holds: its fields and properties.
READABLE = frozenset(STATE_FIELDS) | frozenset(
    name for name, value in vars(TrainState).items() if isinstance(value, property))


def cleared(state: PackedState, name: str) -> PackedState:
    """``state`` with its scalar field ``name`` (e.g. ``"accumulate"``) zero: one small write, nothing donated."""
    slot = getattr(state.packing.slot_tree(), name)
    if not _is_slot(slot) or slot.shape != ():
        raise TrainingError(f"cleared() sets a scalar field, not {name!r}")
    if not slot.packed:
        loose = list(state.loose)
        loose[slot.offset] = jnp.zeros_like(loose[slot.offset])
        return PackedState(state.buffers, tuple(loose), state.packing)
    buffers = list(state.buffers)
    buffers[slot.group] = _write_jit(buffers[slot.group], (slot.offset,), (np.zeros((), buffers[slot.group].dtype),))
    return PackedState(tuple(buffers), state.loose, state.packing)


jax.tree_util.register_pytree_node(
    PackedState,
    lambda p: ((p.buffers, p.loose), p.packing),
    lambda packing, children: PackedState(children[0], children[1], packing),
)

# The TrainState each packed state holds, read once per packed state (the
# state itself stays as it was made).
_UNPACKED: "weakref.WeakKeyDictionary[PackedState, TrainState]" = weakref.WeakKeyDictionary()


def pack(state: TrainState, packing: Packing | None = None) -> PackedState:
    """``state`` packed with one compiled call; its large leaves are shared, not copied.

    Args:
      state: the state (not donated: it stays valid).
      packing: the packing, default ``Packing.of(state)``.

    Returns:
      The packed state, on the state's device.

    Raises:
      TrainingError: ``state`` does not fit ``packing``.
    """
    packing = Packing.of(state) if packing is None else packing
    parts, loose = packing._grouped(state)
    return PackedState(_join_jit(parts), loose, packing)


def unpack(state) -> TrainState:
    """The TrainState a :class:`PackedState` holds, with one compiled call (a TrainState is returned as it is).

    The result is remembered for that packed state (weakly: it goes with
    the packed state), so reading it again costs nothing. Its large leaves
    are shared with the packed state, not copied: a step that donates one
    of the two invalidates them in both.
    """
    if not isinstance(state, PackedState):
        return state
    held = _UNPACKED.get(state)
    if held is None:
        packing = state.packing
        small = packing._small_slots
        held = packing._assemble(_pieces_jit(state.buffers, small) if small else (), state.loose)
        _UNPACKED[state] = held
    return held
