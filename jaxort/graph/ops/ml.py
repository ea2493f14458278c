"""Traditional machine-learning ops of the ai.onnx.ml domain: LabelEncoder, Binarizer,
ArrayFeatureExtractor, TreeEnsemble.

Numeric inputs may be traced: lookups and tree walks compile to gathers over
tables built with numpy at trace time from the attributes. String tensors are
numpy object arrays and never JAX values, so an op reading or writing strings
needs its input static (jaxort runs graphs with string inputs eagerly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxort.errors import OpError
from jaxort.graph import is_static, register, static

from ._common import array_module

_ML = "ai.onnx.ml"


# --------------------------------------------------------------------------- LabelEncoder


def _strings(values) -> np.ndarray:
    arr = np.asarray(values, dtype=object).reshape(-1)
    return np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in arr],
                    dtype=object)


def _chosen(kind: str, lists: dict) -> tuple:
    """The one ``keys_*``/``values_*`` attribute set: (suffix, values)."""
    given = [(name, v) for name, v in lists.items() if v is not None]
    if len(given) != 1:
        names = sorted(f"{kind}_{n}" for n, _ in given) or "none"
        raise OpError(f"exactly one {kind}_* attribute must be set, got {names}")
    name, v = given[0]
    if name == "strings" or (isinstance(v, np.ndarray) and v.dtype.kind in "OSU"):
        return name, _strings(v)
    if name == "floats":
        return name, np.asarray(v, np.float32).reshape(-1)
    if name == "int64s":
        return name, np.asarray(v, np.int64).reshape(-1)
    return name, np.asarray(v).reshape(-1)


def _tensor_default(values: np.ndarray, default_tensor) -> np.ndarray:
    if default_tensor is not None:
        d = np.asarray(default_tensor).reshape(-1)
        if d.size != 1:
            raise OpError(f"default_tensor must hold one value, got shape {list(d.shape)}")
        return _strings(d)[0] if values.dtype == object else d[0].astype(values.dtype)
    # The spec's defaults when default_tensor is absent.
    if values.dtype == object:
        return "_Unused"
    if values.dtype.kind in "iu":
        return np.asarray(-1, values.dtype)
    return np.asarray(-0.0, values.dtype)


def _label_encode(X, keys: np.ndarray, values: np.ndarray, default):
    if len(keys) != len(values):
        raise OpError(f"keys and values must have the same length, got {len(keys)} and "
                      f"{len(values)}")
    string_keys, string_values = keys.dtype == object, values.dtype == object
    if string_keys or string_values:
        X = static(X, "input 'X' (a LabelEncoder with string keys or values runs with numpy)")
    if string_keys:
        if X.dtype.kind not in "OSU":
            raise OpError(f"input 'X' must be a string tensor for string keys, got {X.dtype}")
        table = dict(zip(keys, values))  # a repeated key: the last one wins
        flat = [table.get(v.decode("utf-8") if isinstance(v, bytes) else v, default)
                for v in np.asarray(X, dtype=object).reshape(-1)]
        return np.array(flat, dtype=values.dtype).reshape(X.shape)
    if np.dtype(X.dtype).kind in "OSU":
        raise OpError(f"input 'X' is a string tensor but the keys are {keys.dtype}")
    keys = keys.astype(X.dtype)
    nan = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(len(keys), bool)
    # Repeated keys: the last one wins. Float NaN keys match any NaN input.
    table = {k: v for k, v in zip(keys[~nan].tolist(), values[~nan])}
    nan_value = values[nan][-1] if nan.any() else None
    sorted_keys = np.array(sorted(table), dtype=keys.dtype)
    table_values = np.array([table[k] for k in sorted(table)], dtype=values.dtype)
    xp = array_module(X)
    out_dtype = values.dtype
    if len(sorted_keys):
        pos = xp.clip(xp.searchsorted(sorted_keys, X), 0, len(sorted_keys) - 1)
        hit = xp.asarray(sorted_keys)[pos] == X
        picked = table_values[pos] if xp is np else jnp.asarray(table_values)[pos]
        out = xp.where(hit, picked, xp.asarray(default, dtype=out_dtype))
    else:
        out = xp.full(X.shape, default, dtype=out_dtype)
    if nan_value is not None:
        out = xp.where(xp.isnan(X), xp.asarray(nan_value, dtype=out_dtype), out)
    return out.astype(out_dtype) if xp is np else out


@register("LabelEncoder", since=2, domain=_ML)
def label_encoder_2(X, *, default_float, default_int64, default_string, keys_floats,
                    keys_int64s, keys_strings, values_floats, values_int64s, values_strings):
    """ai.onnx.ml LabelEncoder-2 (keys and values as lists)."""
    return label_encoder(X, default_float=default_float, default_int64=default_int64,
                         default_string=default_string, default_tensor=None,
                         keys_floats=keys_floats, keys_int64s=keys_int64s,
                         keys_strings=keys_strings, keys_tensor=None,
                         values_floats=values_floats, values_int64s=values_int64s,
                         values_strings=values_strings, values_tensor=None)


@register("LabelEncoder", since=4, domain=_ML)
def label_encoder(X, *, default_float, default_int64, default_string, default_tensor,
                  keys_floats, keys_int64s, keys_strings, keys_tensor, values_floats,
                  values_int64s, values_strings, values_tensor):
    """ai.onnx.ml LabelEncoder-4+ (keys and values also as tensors)."""
    _, keys = _chosen("keys", {"floats": keys_floats, "int64s": keys_int64s,
                               "strings": keys_strings, "tensor": keys_tensor})
    which, values = _chosen("values", {"floats": values_floats, "int64s": values_int64s,
                                       "strings": values_strings, "tensor": values_tensor})
    if which == "tensor":
        default = _tensor_default(values, default_tensor)
    else:
        default = {"floats": np.float32(default_float), "int64s": np.int64(default_int64),
                   "strings": default_string}[which]
    return _label_encode(X, keys, values, default)


# --------------------------------------------------------------------------- Binarizer


@register("Binarizer", since=1, domain=_ML)
def binarizer(X, *, threshold):
    """ai.onnx.ml Binarizer-1: 1 where X > threshold, else 0, in X's type."""
    xp = array_module(X)
    dtype = np.dtype(X.dtype)
    if dtype.kind in "iu":
        # For integers, x > t exactly when x > floor(t); compare in X's own type.
        info = np.iinfo(dtype)
        bound = np.asarray(np.clip(np.floor(threshold), info.min - 1.0, info.max), np.float64)
        if bound < info.min:
            return xp.ones_like(X)
        return (X > np.asarray(int(bound), dtype)).astype(dtype)
    return (X > np.asarray(threshold, dtype)).astype(dtype)


# --------------------------------------------------------------------------- ArrayFeatureExtractor


@register("ArrayFeatureExtractor", since=1, domain=_ML)
def array_feature_extractor(X, Y):
    """ai.onnx.ml ArrayFeatureExtractor-1: X[..., Y.flatten()]; a 1-D X gives [1, len]
    (as ONNX Runtime and ONNX's reference do); traced indices past the end give NaN or the
    lowest integer (jnp.take's fill)."""
    xp = array_module(X, Y)
    if np.dtype(X.dtype) == object:
        X, Y, xp = static(X, "input 'X' (a string tensor)"), static(Y, "input 'Y'"), np
    if X.ndim == 0:
        raise OpError("input 'X' must have at least one dimension")
    size = X.shape[-1]
    index = Y.reshape(-1)
    if is_static(index):
        # ONNX Runtime refuses indices past the end and has no negative ones.
        bad = [int(i) for i in index if not 0 <= i < size]
        if bad:
            raise OpError(f"indices {bad} are out of range for the last axis of size {size}")
    out = xp.take(X, index, axis=-1)
    return out.reshape((1, -1)) if X.ndim == 1 else out


# --------------------------------------------------------------------------- TreeEnsemble


_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_AVERAGE, _SUM, _MIN, _MAX = range(4)


def _tree_depth(roots, true_ids, false_ids, true_leafs, false_leafs) -> int:
    """The most interior nodes on a path from a root to a leaf (at least 1)."""
    depth = {}

    def walk(i, seen):
        if i in depth:
            return depth[i]
        if i in seen:
            raise OpError(f"the tree nodes form a cycle through node {i}")
        seen = seen | {i}
        below = [walk(int(child), seen) for child, leaf in
                 ((true_ids[i], true_leafs[i]), (false_ids[i], false_leafs[i])) if not leaf]
        depth[i] = 1 + max(below, default=0)
        return depth[i]

    return max(walk(int(r), frozenset()) for r in roots)


def _membership_table(modes, membership_values, dtype) -> np.ndarray:
    """[nodes, members] values each BRANCH_MEMBER node tests, NaN-padded."""
    members = [[] for _ in modes]
    member_nodes = [i for i, m in enumerate(modes) if m == _MEMBER]
    if member_nodes:
        if membership_values is None:
            raise OpError("BRANCH_MEMBER nodes need the membership_values attribute")
        flat = np.asarray(membership_values, np.float64).reshape(-1)
        sets, current = [], []
        for v in flat:
            if np.isnan(v):
                sets.append(current)
                current = []
            else:
                current.append(v)
        if current:
            sets.append(current)
        if len(sets) != len(member_nodes):
            raise OpError(f"membership_values holds {len(sets)} sets for "
                          f"{len(member_nodes)} BRANCH_MEMBER nodes")
        for i, s in zip(member_nodes, sets):
            members[i] = s
    width = max(1, max(len(m) for m in members))
    table = np.full((len(modes), width), np.nan)
    for i, m in enumerate(members):
        table[i, :len(m)] = m
    return table.astype(dtype)


def _post_transform(scores, post_transform: int):
    """The score transforms as ONNX Runtime computes them (core/providers/cpu/ml/ml_common.h)."""
    if post_transform == 0:
        return scores
    if post_transform == 1:
        return jax.nn.softmax(scores, axis=-1)
    if post_transform == 2:
        return jax.nn.sigmoid(scores)
    if post_transform == 3:  # softmax over the nonzero scores; zeros stay (near) zero
        nonzero = jnp.abs(scores) > 1e-7
        top = jnp.max(scores, axis=-1, keepdims=True)
        e = jnp.where(nonzero, jnp.exp(scores - top), scores * jnp.exp(-top))
        return e / jnp.sum(jnp.where(nonzero, e, 0), axis=-1, keepdims=True)
    if post_transform == 4:
        return np.sqrt(2).astype(scores.dtype) * jax.scipy.special.erfinv(2 * scores - 1)
    raise OpError(f"post_transform must be 0 to 4, got {post_transform}")


@register("TreeEnsemble", since=5, domain=_ML)
def tree_ensemble(X, *, aggregate_function, post_transform, tree_roots, nodes_modes,
                  nodes_featureids, nodes_splits, nodes_truenodeids, nodes_falsenodeids,
                  nodes_trueleafs, nodes_falseleafs, nodes_missing_value_tracks_true,
                  nodes_hitrates, leaf_targetids, leaf_weights, n_targets, membership_values):
    """ai.onnx.ml TreeEnsemble-5: every sample walks every tree in lockstep, one level a step."""
    del nodes_hitrates  # a performance hint only
    X = jnp.asarray(X)
    dtype = np.dtype(X.dtype)
    if X.ndim != 2:
        raise OpError(f"input 'X' must have shape [N, F], got {list(X.shape)}")
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64)
    count = len(modes)
    feature = np.asarray(nodes_featureids, np.int64).reshape(-1)
    splits = np.asarray(nodes_splits).reshape(-1).astype(dtype)
    true_ids = np.asarray(nodes_truenodeids, np.int64).reshape(-1)
    false_ids = np.asarray(nodes_falsenodeids, np.int64).reshape(-1)
    true_leafs = np.asarray(nodes_trueleafs, bool).reshape(-1)
    false_leafs = np.asarray(nodes_falseleafs, bool).reshape(-1)
    track = (np.zeros(count, bool) if nodes_missing_value_tracks_true is None
             else np.asarray(nodes_missing_value_tracks_true, bool).reshape(-1))
    targets = np.asarray(leaf_targetids, np.int64).reshape(-1)
    weights = np.asarray(leaf_weights).reshape(-1).astype(dtype)
    roots = np.asarray(tree_roots, np.int64).reshape(-1)
    lengths = {len(a) for a in (feature, splits, true_ids, false_ids, true_leafs, false_leafs,
                                track)}
    if lengths != {count} or len(targets) != len(weights):
        raise OpError("the nodes_* attributes must have one length, and leaf_targetids and "
                      "leaf_weights another")
    if np.any(modes < 0) or np.any(modes > _MEMBER):
        raise OpError(f"nodes_modes must be 0 to 6, got {sorted(set(modes.tolist()))}")
    if np.any(feature < 0) or np.any(feature >= X.shape[1]):
        raise OpError(f"nodes_featureids must be in [0, {X.shape[1]}), got "
                      f"{sorted(set(feature.tolist()))}")
    for ids, leafs, what in ((true_ids, true_leafs, "true"), (false_ids, false_leafs, "false")):
        bound = np.where(leafs, len(weights), count)
        if np.any(ids < 0) or np.any(ids >= bound):
            raise OpError(f"nodes_{what}nodeids points outside the nodes or leaves")
    if len(roots) == 0 or np.any(roots < 0) or np.any(roots >= count):
        raise OpError(f"tree_roots must index nodes in [0, {count}), got {roots.tolist()}")
    n_targets = int(targets.max()) + 1 if n_targets is None else int(n_targets)
    if np.any(targets < 0) or np.any(targets >= n_targets):
        raise OpError(f"leaf_targetids must be in [0, {n_targets})")
    depth = _tree_depth(roots, true_ids, false_ids, true_leafs, false_leafs)

    # Every node's decision for every sample: [N, nodes].
    x = X[:, feature]
    s = jnp.asarray(splits)
    members = jnp.asarray(_membership_table(modes, membership_values, dtype))
    is_member = jnp.any(x[:, :, None] == members[None], axis=-1)
    mode = jnp.asarray(modes)
    decide = jnp.select(
        [mode == _LEQ, mode == _LT, mode == _GTE, mode == _GT, mode == _EQ, mode == _NEQ],
        [x <= s, x < s, x >= s, x > s, x == s, x != s], is_member)
    decide = decide | (jnp.asarray(track) & jnp.isnan(x))

    # Walk: (node or leaf index, at a leaf) per sample and tree.
    n = X.shape[0]
    index = jnp.broadcast_to(jnp.asarray(roots), (n, len(roots)))
    at_leaf = jnp.zeros((n, len(roots)), bool)
    rows = jnp.arange(n)[:, None]
    for _ in range(depth):
        go_true = decide[rows, index]
        nxt = jnp.where(go_true, jnp.asarray(true_ids)[index], jnp.asarray(false_ids)[index])
        leaf = jnp.where(go_true, jnp.asarray(true_leafs)[index], jnp.asarray(false_leafs)[index])
        index = jnp.where(at_leaf, index, nxt)
        at_leaf = at_leaf | leaf
    value = jnp.asarray(weights)[index]
    target = jnp.asarray(targets)[index]
    out = jnp.zeros((n, n_targets), dtype)
    if aggregate_function in (_SUM, _AVERAGE):
        out = out.at[rows, target].add(value)
        if aggregate_function == _AVERAGE:
            out = out / np.asarray(len(roots), dtype)
    elif aggregate_function in (_MIN, _MAX):
        start = np.finfo(dtype).max if aggregate_function == _MIN else np.finfo(dtype).min
        out = jnp.full((n, n_targets), start, dtype)
        out = (out.at[rows, target].min(value) if aggregate_function == _MIN
               else out.at[rows, target].max(value))
        # A target no tree reaches scores 0, as in ONNX Runtime (the spec does not say;
        # ONNX's reference leaves the float extreme it starts from).
        reached = jnp.zeros((n, n_targets), bool).at[rows, target].set(True)
        out = jnp.where(reached, out, jnp.zeros((), dtype))
    else:
        raise OpError(f"aggregate_function must be 0 to 3, got {aggregate_function}")
    return _post_transform(out, post_transform)
