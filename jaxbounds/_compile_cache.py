"""JAX's persistent compilation cache for the ``jaxbounds`` command and the benchmarks.

A compiled XLA program is written to a folder on disk and read back by the next process that
compiles the same program (same JAX, XLA, devices and flags), so a second run of the same job
skips XLA's compiler. The folder is, in order:

- ``$JAXBOUNDS_COMPILE_CACHE`` when it names a path;
- ``$XDG_CACHE_HOME/jaxbounds/xla`` when ``XDG_CACHE_HOME`` is set;
- ``~/.cache/jaxbounds/xla`` otherwise.

``JAXBOUNDS_COMPILE_CACHE=off`` (or ``0``, ``false``, ``no``, ``none``) turns the cache off. A
cache folder chosen with JAX's own setting (``JAX_COMPILATION_CACHE_DIR`` or
``jax.config.update("jax_compilation_cache_dir", ...)``) is kept as it is.

Only programs whose compilation took at least :data:`MIN_COMPILE_SECONDS` are written (the
small programs that compile in milliseconds would only fill the folder); every such entry is
written whatever its size. The cache is read from and written to by JAX: :func:`enable` sets the
configuration and must run before the process's first compilation.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

__all__ = ["ENV", "MIN_COMPILE_SECONDS", "cache_path", "enable"]

#: The environment variable that moves the cache or turns it off.
ENV = "JAXBOUNDS_COMPILE_CACHE"
#: Programs that compile faster than this are not written to the cache.
MIN_COMPILE_SECONDS = 0.5

_OFF = {"0", "off", "false", "no", "none"}


def cache_path(value: str | None = None) -> Path | None:
    """The cache folder that ``value`` (default: ``$JAXBOUNDS_COMPILE_CACHE``) selects.

    Args:
      value: ``None`` or ``""`` for the default folder, one of ``off``/``0``/``false``/``no``/
        ``none`` (any case) for no cache, or a path (``~`` expanded).

    Returns:
      The folder, or ``None`` when the cache is off.
    """
    if value is None:
        value = os.environ.get(ENV)
    if value is None or not value.strip():
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
        return Path(base) / "jaxbounds" / "xla"
    if value.strip().lower() in _OFF:
        return None
    return Path(value).expanduser()


def enable(path: str | os.PathLike | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``path`` (default: :func:`cache_path`).

    Sets ``jax_compilation_cache_dir``, ``jax_persistent_cache_min_compile_time_secs``
    (:data:`MIN_COMPILE_SECONDS`) and ``jax_persistent_cache_min_entry_size_bytes`` (-1: every
    entry, whatever its size). Does nothing when the cache is off or when JAX's own cache
    folder is already set (that folder is returned). Call it before the first compilation:
    JAX reads the setting once per process.

    Args:
      path: the folder; ``None`` reads ``$JAXBOUNDS_COMPILE_CACHE``.

    Returns:
      The folder in use, or ``None`` when the cache is off.
    """
    chosen = cache_path() if path is None else Path(path).expanduser()
    if chosen is None:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    jax.config.update("jax_compilation_cache_dir", str(chosen))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return chosen
