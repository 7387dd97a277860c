"""Image test fixtures (``pytest_plugins = ("image_fixtures",)``): tiny diffusers checkpoints written once per run
and the synthetic echo LM (``tests/synthetic``) as a rewriter, for the engine tests that must know the rewritten
prompt exactly (that the diffusion paints from it); the serving tests put the tiny Qwen3 chat model there."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from image_helpers import REWRITE_PREFIX
from synthetic.lm_family import write_lm_checkpoint

from omni_stream.models.diffusers_image.checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="session")
def pix2pix_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("pix2pix"), "image-edit")


@pytest.fixture(scope="session")
def sd_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("sd"), "image-generation")


@pytest.fixture(scope="session")
def qwen_edit_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("qwen-edit"), "image-edit-qwen")


@pytest.fixture(scope="session")
def rewriting_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lm_checkpoint(tmp_path_factory.mktemp("lm"), reply_prefix=REWRITE_PREFIX)
