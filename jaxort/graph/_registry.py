"""The op registry: one handler per (domain, op_type, since-version).

Handlers register at import of their module in ``jaxort/graph/ops/``; the
registry is read-only once the ops package has been imported. Dispatch picks
the newest ``since`` that is <= the model's opset for the node's domain.
"""

from __future__ import annotations

import bisect
import dataclasses
import inspect
from typing import Callable

__all__ = ["OpHandler", "register", "lookup", "registered", "normalize_domain"]


def normalize_domain(domain: str) -> str:
    """Maps ONNX's two spellings of the default domain to ``""``.

    Args:
      domain: a node's or an opset import's domain.

    Returns:
      ``""`` for ``""`` and ``"ai.onnx"``, any other domain unchanged.

    Example:
      >>> normalize_domain("ai.onnx"), normalize_domain("com.microsoft")
      ('', 'com.microsoft')
    """
    return "" if domain in ("", "ai.onnx") else domain


@dataclasses.dataclass(frozen=True)
class OpHandler:
    """A registered op implementation.

    Attributes:
      domain: ONNX domain ("" for the default domain).
      op_type: ONNX op type.
      since: first opset version this handler covers.
      fn: the function; inputs positional in spec order, attributes keyword-only.
      foldable: whether the op may be evaluated at trace time when all its
        inputs are static (False for random ops and control flow).
      wants_ctx: the function takes a keyword-only ``ctx`` (an ``OpContext``).
      accepts_all_attrs: the function takes ``**kwargs``.
      attr_names: names of the keyword-only parameters (attributes).
    """

    domain: str
    op_type: str
    since: int
    fn: Callable
    foldable: bool
    wants_ctx: bool
    accepts_all_attrs: bool
    attr_names: frozenset


_REGISTRY: dict[tuple[str, str], dict[int, OpHandler]] = {}


def register(op_type: str, since: int, *, domain: str = "", foldable: bool = True):
    """Registers an op handler for ``domain::op_type`` from opset ``since`` on.

    Args:
      op_type: ONNX op type, e.g. ``"Conv"``.
      since: the opset version at which this handler's semantics start.
      domain: ONNX domain; ``""`` or ``"ai.onnx"`` for the default one.
      foldable: False for ops that must never be evaluated at trace time.

    Raises:
      ValueError: if the same (domain, op_type, since) is registered twice.
    """
    domain = normalize_domain(domain)

    def decorator(fn):
        sig = inspect.signature(fn)
        params = sig.parameters.values()
        kwonly = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        handler = OpHandler(
            domain=domain,
            op_type=op_type,
            since=int(since),
            fn=fn,
            foldable=foldable,
            wants_ctx="ctx" in kwonly,
            accepts_all_attrs=any(p.kind is p.VAR_KEYWORD for p in params),
            attr_names=frozenset(kwonly - {"ctx"}),
        )
        versions = _REGISTRY.setdefault((domain, op_type), {})
        if handler.since in versions:
            raise ValueError(
                f"{domain or 'ai.onnx'}::{op_type} since {since} is registered twice "
                f"({versions[handler.since].fn.__module__} and {fn.__module__})"
            )
        versions[handler.since] = handler
        return fn

    return decorator


def lookup(domain: str, op_type: str, opset: int) -> OpHandler | None:
    """Returns the newest handler with ``since <= opset``, or None."""
    versions = _REGISTRY.get((normalize_domain(domain), op_type))
    if not versions:
        return None
    sinces = sorted(versions)
    i = bisect.bisect_right(sinces, opset)
    return versions[sinces[i - 1]] if i else None


def registered() -> list[OpHandler]:
    """Returns every registered handler, sorted by (domain, op_type, since)."""
    return [
        h
        for key in sorted(_REGISTRY)
        for _, h in sorted(_REGISTRY[key].items())
    ]
