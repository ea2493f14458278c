"""The persistent compilation cache jaxort turns on before it compiles.

A train step of a working-size network compiles for 10-50 s on CPU. With
JAX's persistent compilation cache a second process on the same model
loads the compiled program from disk instead. jaxort turns that cache on
the first time it compiles, in a user cache directory, unless told
otherwise:

- JAX's own setting wins: when ``jax_compilation_cache_dir`` is set
  (``jax.config.update`` or the ``JAX_COMPILATION_CACHE_DIR`` environment
  variable), jaxort leaves it as it is.
- The ``JAXORT_COMPILATION_CACHE`` environment variable names another
  directory, or turns the cache off with ``0``, ``off``, ``false`` or
  ``none``.
- :func:`set_compilation_cache` does the same from Python.

The default directory is ``$XDG_CACHE_HOME/jaxort/xla`` (``~/.cache/jaxort/xla``
when ``XDG_CACHE_HOME`` is unset). The cache is JAX's, so it is
process-wide: once jaxort has turned it on, a program of the user's own JAX
code in the same process that takes at least
``jax_persistent_cache_min_compile_time_secs`` to compile is saved there
too. jaxort lowers that threshold from JAX's default of 1 s to
:data:`MIN_COMPILE_SECS` (0.1 s) when it turns the cache on, unless it was
set to something else. Programs are keyed by their HLO, the compile options,
and the JAX, jaxlib and backend versions, so a changed model, flag or
upgrade compiles anew. Several processes may share a directory: an entry
one process is still writing reads as an error in another, which JAX
reports as a warning before it compiles. Like any compilation cache, the
directory holds code the process runs: keep it writable by its owner only
(jaxort creates it so).

Layer: graph. Imports JAX and the standard library only.
"""

from __future__ import annotations

import os
import pathlib
import threading
import warnings
from typing import Optional, Union

import jax
from jax.experimental.compilation_cache import compilation_cache as _jax_cache

__all__ = ["ENV_VAR", "MIN_COMPILE_SECS", "compilation_cache_dir", "default_cache_dir", "set_compilation_cache",
           "use_compilation_cache"]

ENV_VAR = "JAXORT_COMPILATION_CACHE"
_OFF = frozenset({"0", "off", "false", "no", "none", ""})
# Programs that compile for at least this long are cached (JAX's own default: 1 s).
MIN_COMPILE_SECS = 0.1
_JAX_MIN_COMPILE_SECS = 1.0

_lock = threading.Lock()
# None until the first compile (or set_compilation_cache) decides; then the
# directory in use, or "" for none.
_decided: Optional[str] = None
# Whether jaxort set JAX's directory (rather than found one the user set).
_ours = False


def default_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/jaxort/xla``, or ``~/.cache/jaxort/xla``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "jaxort" / "xla"


def _wanted() -> Optional[str]:
    """The directory the environment asks for (None: off)."""
    value = os.environ.get(ENV_VAR)
    if value is None:
        return str(default_cache_dir())
    if value.strip().lower() in _OFF:
        return None
    return os.path.expanduser(value)


def _turn_on(path: str) -> str:
    """Points JAX's cache at ``path`` (created, owner-only); "" with a warning when it cannot be made."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as err:
        warnings.warn(f"jaxort: no persistent compilation cache: cannot create {path!r} ({err}); "
                      f"set {ENV_VAR} to another directory or to 'off'", RuntimeWarning, stacklevel=3)
        return ""
    if jax.config.jax_compilation_cache_dir != path:
        # JAX opens its cache once; a new directory needs it reopened.
        _jax_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", path)
    if jax.config.jax_persistent_cache_min_compile_time_secs == _JAX_MIN_COMPILE_SECS:
        # A session's first step also compiles a few programs of 0.1-1 s (the
        # optimizer step, the packing of a state): worth keeping too.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
    return path


def use_compilation_cache() -> Optional[str]:
    """Turns the persistent compilation cache on as the module docstring says (once; cheap after).

    jaxort calls this before it compiles; users need not.

    Returns:
      The directory the cache uses, or None when it is off.
    """
    global _decided, _ours
    if _decided is None:
        with _lock:
            if _decided is None:
                own = jax.config.jax_compilation_cache_dir
                if own:
                    _decided = own
                else:
                    wanted = _wanted()
                    _decided = "" if wanted is None else _turn_on(wanted)
                    _ours = bool(_decided)
    return _decided or None


def set_compilation_cache(path: Union[str, os.PathLike, None]) -> Optional[str]:
    """Moves jaxort's persistent compilation cache to ``path``, or turns it off with None.

    It takes effect for programs compiled after the call. Turning it off
    unsets JAX's ``jax_compilation_cache_dir`` if jaxort had set it; a
    directory the user gave JAX directly is left alone, and stays in use.

    Args:
      path: a directory (created if missing), or None.

    Returns:
      The directory now in use, or None.

    Example:
      >>> import jaxort.graph
      >>> jaxort.graph.set_compilation_cache(None)  # no cache for this process
    """
    global _decided, _ours
    with _lock:
        if path is None:
            if _ours and jax.config.jax_compilation_cache_dir == _decided:
                _jax_cache.reset_cache()
                jax.config.update("jax_compilation_cache_dir", None)
                _decided = ""
            elif not jax.config.jax_compilation_cache_dir:
                _decided = ""
            # else: the user's own directory for JAX stays, and stays reported
        else:
            _decided = _turn_on(os.fspath(path))
            _ours = bool(_decided)
        return _decided or None


def compilation_cache_dir() -> Optional[str]:
    """The directory of the persistent compilation cache in use, or None (decides it if not yet decided)."""
    return use_compilation_cache()
