"""String ops, evaluated with numpy on static (object-dtype) string tensors.

Strings cannot be JAX values, so every input here must be static; jaxort runs
graphs with string inputs eagerly, where all values stay numpy.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

from jaxort.errors import OpError
from jaxort.graph import register, static


def _strings(x, what="input 'X'") -> np.ndarray:
    x = static(x, what)
    if x.dtype.kind not in ("O", "U", "S"):
        raise OpError(f"{what} must be a string tensor, got {x.dtype}")
    if x.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(x)
    return x.astype(object)


def _strip_accents(s: str) -> str:
    try:
        s.encode("ascii")
        return s
    except UnicodeEncodeError:
        return "".join(c for c in unicodedata.normalize("NFKD", s)
                       if not unicodedata.combining(c))


@register("StringNormalizer", since=10)
def string_normalizer(X, *, case_change_action, is_case_sensitive, locale=None,
                      stopwords=None):
    """StringNormalizer-10+ (locale is ignored: case mapping is Unicode's default)."""
    x = _strings(X)
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise OpError(f"input must have shape [C] or [1, C], got "
                      f"{list(x.shape)}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise OpError(f"unknown case_change_action {case_change_action!r}")
    stops = set(stopwords or ())
    if not is_case_sensitive:
        stops = {w.lower() for w in stops}

    def change(s):
        if case_change_action == "LOWER":
            return s.lower()
        if case_change_action == "UPPER":
            return s.upper()
        return s

    out = []
    for s in x.reshape(-1):
        s = _strip_accents(s if isinstance(s, str) else "")
        key = s if is_case_sensitive else s.lower()
        if key in stops:
            continue
        out.append(change(s))
    if not out:
        out = [""]
    res = np.array(out, dtype=object)
    return res.reshape(1, -1) if x.ndim == 2 else res


@register("StringConcat", since=20)
def string_concat(X, Y):
    """StringConcat-20+ (numpy broadcasting)."""
    x, y = _strings(X), _strings(Y, "input 'Y'")
    try:
        bx, by = np.broadcast_arrays(x, y)
    except ValueError:
        raise OpError(f"shapes {list(x.shape)} and {list(y.shape)} do "
                      "not broadcast") from None
    out = np.empty(bx.shape, dtype=object)
    for i in np.ndindex(bx.shape):
        out[i] = bx[i] + by[i]
    return out


@register("StringSplit", since=20)
def string_split(X, *, delimiter=None, maxsplit=None):
    """StringSplit-20+ (no or empty delimiter splits on runs of whitespace)."""
    x = _strings(X)
    sep = delimiter or None
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [s.split(sep, limit) for s in x.reshape(-1)]
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = max((len(p) for p in parts), default=0)
    out = np.empty((len(parts), width), dtype=object)
    out[...] = ""
    for i, p in enumerate(parts):
        out[i, :len(p)] = p
    return out.reshape(x.shape + (width,)), counts


@register("RegexFullMatch", since=20)
def regex_full_match(X, *, pattern=None):
    """RegexFullMatch-20+ (Python's re, which accepts the RE2 syntax ONNX specifies)."""
    x = _strings(X)
    try:
        rx = re.compile(pattern or "")
    except re.error as e:
        raise OpError(f"invalid pattern {pattern!r}: {e}") from None
    out = np.zeros(x.shape, dtype=bool)
    for i in np.ndindex(x.shape):
        out[i] = rx.fullmatch(x[i]) is not None
    return out


@register("TfIdfVectorizer", since=9)
def tf_idf_vectorizer(X, *, mode, min_gram_length, max_gram_length, max_skip_count,
                      ngram_counts, ngram_indexes, pool_int64s=None, pool_strings=None,
                      weights=None):
    """TfIdfVectorizer-9+ (needs a static input; n-grams of size 1 count once, larger
    ones once per skip distance)."""
    x = static(X, "input 'X'")
    if x.dtype.kind in "OUS":
        x = _strings(X)
        pool = list(pool_strings or [])
    else:
        pool = [int(v) for v in (pool_int64s or [])]
    if mode not in ("TF", "IDF", "TFIDF"):
        raise OpError(f"unknown mode {mode!r}")
    if x.ndim not in (1, 2):
        raise OpError(f"input must be 1-D or 2-D, got {list(x.shape)}")
    ngram_indexes = list(ngram_indexes)
    size = max(ngram_indexes) + 1 if ngram_indexes else 0
    starts = list(ngram_counts) + [len(pool)]
    grams, gid = {}, 0
    for k in range(1, len(ngram_counts) + 1):
        lo, hi = starts[k - 1], starts[k]
        for j in range(lo, hi - k + 1, k):
            if min_gram_length <= k <= max_gram_length:
                grams.setdefault(tuple(pool[j:j + k]), ngram_indexes[gid])
            gid += 1
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    counts = np.zeros((rows.shape[0], size), np.float32)
    for r, row in enumerate(rows):
        row = [v if isinstance(v, str) else int(v) for v in row]
        for n in range(max(min_gram_length, 1), max_gram_length + 1):
            for skip in range(1, (max_skip_count + 1 if n > 1 else 1) + 1):
                for start in range(len(row) - skip * (n - 1)):
                    idx = grams.get(tuple(row[start:start + skip * (n - 1) + 1:skip]))
                    if idx is not None:
                        counts[r, idx] += 1
    w = np.asarray(weights, np.float32) if weights else None
    if mode == "TF":
        out = counts
    elif mode == "IDF":
        out = (counts > 0).astype(np.float32) * (w if w is not None else 1)
    else:
        out = counts * (w if w is not None else 1)
    out = out.astype(np.float32)
    return out.reshape(-1) if x.ndim == 1 else out
