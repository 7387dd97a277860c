"""Embedded default checkpoints: built once into the user cache, atomically (temp directory + rename).

The cache is ``Tuning.cache_dir`` (``$OMNI_STREAM_CACHE``) or the platform's user cache directory for
``omni-stream``; a finished build carries a marker file, so a crash mid-build leaves only a temp directory (removed)
or an unmarked leftover (rebuilt), never a half checkpoint that loads.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_MARKER = ".omni-stream-embedded"


def user_cache_root() -> Path:
    """The platform's user cache directory for omni-stream."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("omni-stream"))


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` (an engine passes ``Tuning.cache_dir`` or :func:`user_cache_root`), else
    ``$OMNI_STREAM_CACHE`` (a builder called outside an engine), else :func:`user_cache_root`."""
    if cache_dir is not None:
        return Path(cache_dir)
    from omni_stream.runtime.settings import cache_dir_from_env

    return cache_dir_from_env() or user_cache_root()


def embedded_checkpoint_dir(
    name: str, write: Callable[[Path], object], note: str, cache_dir: str | Path | None = None
) -> Path:
    """``<cache>/checkpoints/<name>``, written by ``write(dir)`` on first use; ``note`` says what it is (logged)."""
    target = cache_root(cache_dir) / "checkpoints" / name
    if (target / EMBEDDED_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.warning("building the embedded tiny checkpoint in %s (%s)", target, note)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        write(tmp)
        (tmp / EMBEDDED_MARKER).write_text(f"tiny random-weight checkpoint built by omni-stream; {note}\n")
        if target.exists():  # a half-built leftover without its marker
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / EMBEDDED_MARKER).exists():  # another process did not win the race either
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
