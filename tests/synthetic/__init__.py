"""Synthetic families for tests and CPU benchmarks, never installed: a sine-tone TTS (``model_type: synthetic_tts``),
an echoing LM (``synthetic_lm``) and a tone-naming ASR (``synthetic_asr``).

They stand in for a real model only where a random-weight one cannot show a behaviour: a fault at a given step,
an exact output length, a stream checked sample by sample, emulated device time (``step_cost_ms``). The package is
no part of ``omni_stream``: the tests' ``conftest.py`` (and a benchmark that uses them) call :func:`register`, which
declares the three families to the engine's registry as any plugin would; a server started as a subprocess finds
them through :func:`plugin_site` (a dist-info naming them in the ``omni_stream.families`` entry-point group).

``write_checkpoint(dir, **opts)`` writes a checkpoint the engine loads like any other:
``await AsyncEngine.from_pretrained(write_checkpoint(tmp_path / "synthetic"))``. Each voice speaks a sine
tone of its own pitch (:func:`tone_hz`); audio is exactly :func:`tone_samples` of the request's tone.
Text markers ``[[fail:step@K]]``, ``[[fail:seq@K]]`` and ``[[fail:stage@K]]`` make a request fail on purpose
(raising :class:`SyntheticFault`) in the model step, in its own sequence, or in its codec stage.
"""

from __future__ import annotations

import os
from pathlib import Path

from omni_stream.family_registry import declare_family
from synthetic.config import (
    MODEL_TYPE,
    Faults,
    SyntheticConfig,
    tone_hz,
    tone_samples,
    write_checkpoint,
)
from synthetic.declaration import FAMILIES
from synthetic.family import SyntheticFamily, load_family
from synthetic.model import (
    SyntheticCodec,
    SyntheticFault,
    SyntheticTalker,
    TalkerInput,
    parse_faults,
)

TESTS = Path(__file__).resolve().parent.parent  # the folder that holds this package (on sys.path for imports)


def register() -> None:
    """Declare the three synthetic families to the engine's registry (idempotent: a declaration replaces its own)."""
    for declaration in FAMILIES:
        declare_family(declaration)


def plugin_site(root: Path) -> Path:
    """A folder to put on a subprocess's ``PYTHONPATH`` (with :data:`TESTS`) so that its registry finds the synthetic
    families through the ``omni_stream.families`` entry-point group, as an installed plugin's would be found."""
    dist = root / "omni_stream_synthetic-1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: omni-stream-synthetic\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[omni_stream.families]\nsynthetic = synthetic.declaration:FAMILIES\n")
    return root


def subprocess_env(root: Path) -> dict[str, str]:
    """Environment additions under which a subprocess (``omni-stream serve``) serves synthetic checkpoints."""
    site = plugin_site(root)
    path = os.pathsep.join(p for p in (str(TESTS), str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


__all__ = [
    "MODEL_TYPE",
    "Faults",
    "SyntheticCodec",
    "SyntheticConfig",
    "SyntheticFamily",
    "SyntheticFault",
    "SyntheticTalker",
    "TalkerInput",
    "load_family",
    "parse_faults",
    "plugin_site",
    "register",
    "subprocess_env",
    "tone_hz",
    "tone_samples",
    "write_checkpoint",
]
