"""Headless Chromium for the page tests: Debian's build at /usr/bin/chromium driven by playwright (no downloaded
browsers), each run in a fresh, empty profile directory."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
)


def skip_without_browser() -> None:
    """Skip the calling test without Chromium or the playwright package."""
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("needs the playwright Python package (pip install playwright; no browser download)")


@contextlib.contextmanager
def chromium(profile: Path, *flags: str) -> Iterator[Any]:
    """A playwright browser context in the new profile directory ``profile``, with :data:`FLAGS` and ``flags``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=[*FLAGS, *flags], chromium_sandbox=False
        )
        try:
            yield context
        finally:
            context.close()
