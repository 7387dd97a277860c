"""What loading prints: one progress display (each model's own bar, ``LoadOptions.progress_bar``) and log lines on
lines of their own.

- :func:`library_bars_off`: while a family loads, the progress bars transformers and diffusers draw for their own
  loads (per weight file, per pipeline component) are off, so they never nest inside or interleave with the
  model's bar. Each library's switch is process-wide; it is restored afterwards. A library that is not installed
  is left alone.
- :func:`log_lines_above_bars`: while an engine loads, log records that reach the root logger's console handlers
  are written through tqdm, which clears the bar being drawn, writes the record on its own line and draws the bar
  again below it.
- :class:`ProgressBar` / :class:`ProgressFactory`: what a loader may do with a bar (tqdm's, or a disabled one) and
  what makes one (``LoadOptions.progress_bar``, passed on to graph captures).
- :func:`quiet_pil_fallback`: transformers says, once per image processor, that it falls back to the processor's
  PIL backend because torchvision is not installed. The PIL backend is the one wanted here (torchvision is no
  dependency of this package; the diffusers pipelines' image processors run on PIL), so that notice is dropped;
  every other record of transformers passes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
from collections.abc import Iterator
from typing import Protocol

_LIBRARIES = ("transformers", "diffusers")  # each has utils.logging.{is,enable,disable}_progress_bar
_IMPORT_LOGGER = "transformers.utils.import_utils"  # where the PIL fallback notice is logged


class ProgressBar(Protocol):
    """The part of a tqdm bar loaders use; a context manager that closes it."""

    def update(self, n: float = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ProgressBar: ...

    def __exit__(self, *exc_info: object) -> object: ...


class ProgressFactory(Protocol):
    """``progress(total=, desc=, unit=)``: a new bar (``LoadOptions.progress_bar``)."""

    def __call__(self, total: int | None = None, desc: str = "loading", unit: str = "it") -> ProgressBar: ...


def _drop_pil_fallback(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not ("requires torchvision (not installed)" in message and "falling back to" in message)


def quiet_pil_fallback() -> None:
    """Drop transformers' notice of an image processor's PIL fallback (idempotent; needs no transformers import:
    the filter sits on the logger the notice comes from)."""
    logger = logging.getLogger(_IMPORT_LOGGER)
    if _drop_pil_fallback not in logger.filters:
        logger.addFilter(_drop_pil_fallback)


@contextlib.contextmanager
def library_bars_off() -> Iterator[None]:
    """transformers' and diffusers' own progress bars off for the block (blocking: it may import them; run it off
    the event loop, where the family loads)."""
    quiet_pil_fallback()
    switched = []
    for name in _LIBRARIES:
        if importlib.util.find_spec(name) is None:
            continue
        switches = importlib.import_module(f"{name}.utils.logging")
        if switches.is_progress_bar_enabled():
            switches.disable_progress_bar()
            switched.append(switches)
    try:
        yield
    finally:
        for switches in switched:
            switches.enable_progress_bar()


@contextlib.contextmanager
def log_lines_above_bars(enabled: bool = True) -> Iterator[None]:
    """Console log records go through tqdm for the block (``enabled`` False: nothing changes)."""
    if not enabled:
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    with logging_redirect_tqdm():
        yield
