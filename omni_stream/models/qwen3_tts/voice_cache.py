"""Voice prompts kept by the content of the reference audio they came from (``Tuning.voice_cache``).

A Base request that carries reference audio costs its extraction (the speaker encoder and, in context, the codec
encoder) on the device worker, between the talker's steps. Clients often send the same reference with every request;
keyed by the audio's samples, sample rate and transcript, the second one reuses the first's prompt. Event loop only
(the family looks entries up and stores them there; the key is computed off the loop). Least recently used entries
leave first. Two requests with the same new reference that arrive together both extract it (the cache holds results,
not extractions in progress).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from omni_stream.requests import VoicePrompt


def voice_key(audio: np.ndarray, sample_rate: int, ref_text: str | None) -> bytes:
    """A digest of float32 mono ``audio``, its rate and its transcript (None: an x-vector-only prompt)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    h.update(f"|{sample_rate}|{'' if ref_text is None else 't:' + ref_text}".encode())
    return h.digest()


class VoiceCache:
    """At most ``size`` prompts by :func:`voice_key`; ``hits`` and ``misses`` count the lookups."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1 entries, got {size}")
        self.size = size
        self._prompts: OrderedDict[bytes, VoicePrompt] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._prompts)

    def get(self, key: bytes) -> VoicePrompt | None:
        prompt = self._prompts.get(key)
        if prompt is None:
            self.misses += 1
            return None
        self._prompts.move_to_end(key)
        self.hits += 1
        return prompt

    def put(self, key: bytes, prompt: VoicePrompt) -> None:
        self._prompts[key] = prompt
        self._prompts.move_to_end(key)
        while len(self._prompts) > self.size:
            self._prompts.popitem(last=False)
