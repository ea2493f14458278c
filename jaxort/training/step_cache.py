"""Traced steps saved beside the compilation cache, so a new process skips tracing.

JAX's persistent compilation cache (:mod:`jaxort.graph.compilation_cache`)
saves XLA's compile, but a new process still traces the ONNX graph, its
gradient and the optimizer into a jaxpr and lowers that to StableHLO before
it can even look the program up: 1.2 s of a 2.5 s warm first step for
ResNet-18 at 64x64, 3.5 of 8.8 s for ResNet-50 at 224. This module saves each
step as a serialized :func:`jax.export.export` (StableHLO and the argument
and result types; no Python objects, no pickle) in ``jaxort-steps/`` inside
the compilation cache's directory, and a later process calls the saved
program instead of tracing. The program it runs is the same in both
processes (the exporting process calls its own export too), so XLA's cache
entry is shared.

An entry is found by a SHA-256 of everything the traced program depends on:

- the program's *fingerprint* (:func:`program_fingerprint`): the training
  and eval models' bytes, the optimizer's type and attributes, the
  mixed-precision policy, the fusion switch, the parameter and input names,
  the source of every jaxort module, and the JAX and jaxlib versions;
- the step's kind and static options, the platform, the JAX settings that
  change tracing (:data:`_TRACING_CONFIG`), and the arguments' tree
  structure, shapes, dtypes and weak types.

Programs that depend on Python code the fingerprint cannot see are never
saved: a JAX loss function, an optax optimizer, a hand-built
``OrtOptimizer``, an op or pattern registered from outside jaxort, steps on
a mesh, and schedules. A step JAX cannot export (a host callback, say) is
traced as before. A damaged or foreign entry is ignored and written again.
The cache is on exactly when the compilation cache is on, and shares its
switches (``JAXORT_COMPILATION_CACHE``, :func:`jaxort.graph.set_compilation_cache`).

Layer: training.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import tempfile
from typing import Any, Callable, Iterable, Optional

import jax
import jaxlib

from jaxort.graph import compilation_cache, registered
from jaxort.graph.patterns import registered_patterns

__all__ = ["SUBDIR", "CachedStep", "program_fingerprint", "step_cache_dir"]

SUBDIR = "jaxort-steps"
_SUFFIX = ".jaxexport"
# JAX settings that change what a function traces to (not how XLA compiles it).
_TRACING_CONFIG = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                   "jax_threefry_partitionable", "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion",
                   "jax_softmax_custom_jvp", "jax_dynamic_shapes")


def step_cache_dir() -> Optional[pathlib.Path]:
    """``jaxort-steps/`` in the compilation cache's directory, or None when that cache is off."""
    base = compilation_cache.use_compilation_cache()
    return None if base is None else pathlib.Path(base) / SUBDIR


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """SHA-256 over jaxort's Python sources (path and bytes of each), with the JAX versions."""
    root = pathlib.Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"jax {jax.__version__} jaxlib {jaxlib.__version__}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _registries_are_jaxort_own() -> bool:
    """Whether every registered op and pattern comes from jaxort itself (a user's may change unseen)."""
    fns = [h.fn for h in registered()] + [p.handler for p in registered_patterns()] + [
        p.match for p in registered_patterns()]
    return all(getattr(fn, "__module__", "").startswith("jaxort.") for fn in fns)


def program_fingerprint(models: Iterable[Any], parts: Iterable[Any]) -> Optional[str]:
    """A digest of a program's models, ``parts`` (reprs of its options) and jaxort's sources.

    Args:
      models: ``onnx.ModelProto``\\ s (or None) whose bytes the program traces.
      parts: values with a ``repr`` that is stable across processes.

    Returns:
      The hex digest, or None when a model cannot be serialized (over 2 GiB)
      or an op or pattern from outside jaxort is registered.
    """
    if not _registries_are_jaxort_own():
        return None
    digest = hashlib.sha256(_source_digest().encode())
    for model in models:
        try:
            data = b"" if model is None else model.SerializeToString(deterministic=True)
        except Exception:  # protobuf's EncodeError: a model over 2 GiB
            return None
        digest.update(hashlib.sha256(data).digest())
    digest.update(repr(tuple(parts)).encode())
    return digest.hexdigest()


def _aval(x):
    """What JAX sees of an argument (array, numpy array or Python scalar): shape, canonical dtype, weak type."""
    typeof = getattr(jax, "typeof", None)  # jax >= 0.4.38; jax.core.get_aval before
    return typeof(x) if typeof is not None else jax.core.get_aval(x)


def _signature(args: tuple) -> str:
    """The arguments' tree structure and each leaf's shape, dtype and weak type."""
    leaves, treedef = jax.tree.flatten(args)
    avals = [(tuple(a.shape), str(a.dtype), bool(a.weak_type)) for a in map(_aval, leaves)]
    return f"{treedef}|{avals}"


class CachedStep:
    """A compiled step read from, or saved to, the step cache on its first call with each argument signature.

    Args:
      fn: the step as traced (``fn(state, *args)``, the state first).
      jitted: ``jax.jit`` of ``fn`` as the step runs without the cache.
      fingerprint: the program's (:func:`program_fingerprint`).
      static: reprs of the step's kind and static options.
      platform: the platform the step is for; the cache is used only for
        JAX's default backend (``jax.export`` lowers for that one).
      donate_state: whether the step donates its state (every step but eval).
      state_out: what the step returns: ``"state"``, ``"outputs"`` or
        ``"both"`` (``(state, outputs)``), outputs being a tuple of arrays.
      on_load: called when the step was read from the cache (counts loads).
    """

    def __init__(self, fn: Callable, jitted: Callable, *, fingerprint: str, static: tuple, platform: str,
                 donate_state: bool, state_out: str, on_load: Callable[[], None]):
        self._fn = fn
        self._jitted = jitted
        self._fingerprint = fingerprint
        self._static = static
        self._platform = platform
        self._donate = {"donate_argnums": 0} if donate_state else {}
        self._state_out = state_out
        self._on_load = on_load
        self._run: Optional[Callable] = None

    def __call__(self, *args):
        run = self._run
        if run is None:
            run = self._run = self._first()
        return run(*args)

    def _first(self) -> Callable:
        folder = step_cache_dir()
        if folder is None or self._platform != jax.default_backend():
            return self._jitted

        def run(*args):
            # Traced by jax.jit once per argument signature (a new batch shape
            # traces again), so each signature has an entry of its own.
            exported, out_tree = self._program(folder, args)
            if exported is None:
                return self._fn(*args)
            return jax.tree.unflatten(out_tree, exported.call(*jax.tree.leaves(args)))
        return jax.jit(run, **self._donate)

    def _program(self, folder: pathlib.Path, args: tuple):
        """The exported step for the signature of ``args`` (abstract values) and its result
        structure, read from the cache or exported and written there; ``(None, None)`` when
        the step cannot be exported."""
        config = tuple((name, str(getattr(jax.config, name, None))) for name in _TRACING_CONFIG)
        key = hashlib.sha256(repr((self._fingerprint, self._static, self._platform, config,
                                   _signature(args))).encode()).hexdigest()
        path = folder / f"{key}{_SUFFIX}"
        leaves = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
                  for a in map(_aval, jax.tree.leaves(args))]
        exported = self._read(path, leaves)
        if exported is not None:
            self._on_load()
            return exported, self._out_tree(args, len(exported.out_avals))
        exported, out_tree = self._export(args, leaves)
        if exported is not None and out_tree == self._out_tree(args, len(exported.out_avals)):
            _write(path, exported.serialize())
        return exported, out_tree

    def _read(self, path: pathlib.Path, leaves: list):
        """The entry at ``path`` when it exists and takes ``leaves`` (abstract values); else None."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            exported = jax.export.deserialize(bytearray(data))
        except Exception:  # a damaged or foreign file: written again after tracing
            return None
        takes = [(tuple(a.shape), a.dtype) for a in exported.in_avals]
        if takes != [(tuple(a.shape), a.dtype) for a in leaves]:
            return None
        return exported

    def _export(self, args: tuple, leaves: list):
        """Traces the step once as a flat function and exports it: ``(exported, out_tree)``, or (None, None)."""
        in_tree = jax.tree.structure(args)
        box: dict = {}

        def flat(*xs):
            out_leaves, box["tree"] = jax.tree.flatten(self._fn(*jax.tree.unflatten(in_tree, xs)))
            return out_leaves
        try:
            exported = jax.export.export(jax.jit(flat))(*leaves)
        except Exception:  # e.g. a host callback JAX cannot export: traced as without the cache
            return None, None
        return exported, box["tree"]

    def _out_tree(self, args: tuple, n_out: int):
        """The result structure a step of this kind returns, for ``n_out`` result leaves."""
        state = jax.tree.structure(args[0])
        if self._state_out == "state":
            return state
        n_outputs = n_out - (0 if self._state_out == "outputs" else state.num_leaves)
        outputs = jax.tree.structure((0,) * max(n_outputs, 0))
        if self._state_out == "outputs":
            return outputs
        return jax.tree.structure((jax.tree.unflatten(state, [0] * state.num_leaves),
                                   jax.tree.unflatten(outputs, [0] * outputs.num_leaves)))


def _write(path: pathlib.Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (a reader never sees part of it); failures are ignored."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # a read-only or full cache directory: the step still runs, traced next time
