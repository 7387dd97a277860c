"""Makes the reference ``qwen_tts`` (and faster-qwen3-tts, built on it) importable and loadable for the peer runs.

``qwen_tts`` imports its 25 Hz tokenizer eagerly (sox, torchaudio, onnxruntime, einops, librosa), which the 12 Hz
CustomVoice path never calls; stand-in modules take the place of any that are missing, and raise if called.
On transformers >= 5.17, ``MimiConfig`` keeps the RoPE base only in ``rope_parameters``, while the ``"default"``
initializer ``qwen_tts`` registers reads ``config.rope_theta``; :func:`patch_rope_registry` wraps it to fall back.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

_STUBBED: list[str] = []


def _unavailable(name: str):
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is a stand-in here (not installed); the 12 Hz CustomVoice path never calls it")

    return call


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def stub_unused_audio_deps() -> list[str]:
    """Put stand-ins in ``sys.modules`` for the 25 Hz tokenizer's imports that fail here; returns their names."""
    import transformers
    import transformers.modeling_utils  # noqa: F401  (its optional-dependency probes run before any stand-in exists)

    replacements = {
        "sox": {},
        "onnxruntime": {},
        "torchaudio": {},
        "torchaudio.compliance": {},
        "torchaudio.compliance.kaldi": {},
        "einops": {"rearrange": _unavailable("einops"), "repeat": _unavailable("einops")},
        "librosa": {"load": _unavailable("librosa"), "resample": _unavailable("librosa")},
        "librosa.filters": {"mel": _unavailable("librosa")},
    }
    for name, attrs in replacements.items():
        if name in sys.modules:
            continue
        try:
            __import__(name)
        except Exception:
            sys.modules[name] = _module(name, **attrs)
            _STUBBED.append(name)
    for name in _STUBBED:
        if "." in name:
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, sys.modules[name])
    return list(_STUBBED)


def stand_ins() -> list[str]:
    """The modules replaced by stand-ins so far in this process."""
    return list(_STUBBED)


def patch_rope_registry() -> bool:
    """Wrap the registered ``"default"`` RoPE initializer to read ``rope_parameters`` when ``rope_theta`` is absent.

    Returns whether a wrapper was installed. Numerics are unchanged: the same base reaches the same function.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    original = ROPE_INIT_FUNCTIONS.get("default")
    if original is None or getattr(original, "_rope_theta_fallback", False):
        return False

    def default_rope(config: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(config, "rope_theta", None) is None:
            params = getattr(config, "rope_parameters", None) or {}
            if "rope_theta" in params:
                config.rope_theta = params["rope_theta"]
        return original(config, *args, **kwargs)

    default_rope._rope_theta_fallback = True  # type: ignore[attr-defined]
    ROPE_INIT_FUNCTIONS["default"] = default_rope
    return True


def import_reference() -> Any:
    """Import ``qwen_tts`` with the stand-ins and the RoPE fallback in place; returns the module."""
    stub_unused_audio_deps()
    import qwen_tts

    patch_rope_registry()
    return qwen_tts
