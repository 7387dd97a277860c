"""Uploaded voices on disk: one safetensors file per voice, written to a temp file and renamed into place.

A voice file holds the decoded reference audio (float32 mono), the uploaded bytes as they came, the cloning
prompt's tensors when the engine extracted one, and the metadata as JSON in the safetensors header. A crash
before the rename leaves only a ``.tmp-*`` file, which the next start deletes; names are case-insensitive.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save as save_tensors

from omni_stream.requests import VoicePrompt

log = logging.getLogger("omni_stream.realtime.speech.voices")

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SUFFIX = ".voice"
TMP_PREFIX = ".tmp-"
FORMAT_VERSION = "1"


class VoiceLimitError(Exception):
    """The store already holds its maximum number of voices."""


def validate_name(name: str) -> str | None:
    """The reason ``name`` is not a valid voice name, or None when it is."""
    if not NAME_RE.fullmatch(name):
        return "Voice name must be 1-64 characters of letters, digits, '-' and '_'"
    return None


@dataclass(slots=True, frozen=True)
class StoredVoice:
    """One uploaded voice. ``samples`` is float32 mono at ``sample_rate`` Hz; ``created_at`` in Unix seconds."""

    name: str
    consent: str
    created_at: int
    mime_type: str
    file_size: int
    samples: np.ndarray
    sample_rate: int
    ref_text: str | None = None
    speaker_description: str | None = None
    prompt: VoicePrompt | None = None
    prompt_model: str | None = None  # which checkpoint extracted ``prompt`` (prompts do not carry across models)

    @property
    def key(self) -> str:
        return self.name.lower()

    def public(self) -> dict[str, Any]:
        """The wire description (``uploaded_voices`` entries and upload responses)."""
        out: dict[str, Any] = {
            "name": self.name,
            "consent": self.consent,
            "created_at": self.created_at,
            "file_size": self.file_size,
            "mime_type": self.mime_type,
        }
        direct = self.samples.size == 0 and self.prompt is not None  # uploaded as a speaker embedding
        out["embedding_source"] = "direct" if direct else "audio"
        out["embedding_dim"] = int(self.prompt.x_vector.size) if direct and self.prompt is not None else None
        if self.ref_text:
            out["ref_text"] = self.ref_text
        if self.speaker_description:
            out["speaker_description"] = self.speaker_description
        return out


def _meta(voice: StoredVoice) -> dict[str, str]:
    fields = {
        "name": voice.name,
        "consent": voice.consent,
        "created_at": voice.created_at,
        "mime_type": voice.mime_type,
        "file_size": voice.file_size,
        "sample_rate": voice.sample_rate,
        "ref_text": voice.ref_text,
        "speaker_description": voice.speaker_description,
        "prompt_ref_text": voice.prompt.ref_text if voice.prompt is not None else None,
        "prompt_model": voice.prompt_model,
    }
    return {"format": FORMAT_VERSION, "voice": json.dumps(fields)}


def encode_voice(voice: StoredVoice, original: bytes) -> bytes:
    """The voice file's bytes."""
    tensors: dict[str, np.ndarray] = {
        "samples": np.ascontiguousarray(voice.samples, dtype=np.float32),
        "original": np.frombuffer(original, dtype=np.uint8).copy() if original else np.zeros(0, np.uint8),
    }
    if voice.prompt is not None:
        tensors["x_vector"] = np.ascontiguousarray(voice.prompt.x_vector)
        if voice.prompt.ref_codes is not None:
            tensors["ref_codes"] = np.ascontiguousarray(voice.prompt.ref_codes)
    return save_tensors(tensors, metadata=_meta(voice))


def read_voice(path: Path) -> StoredVoice:
    """Load one voice file; raises ValueError (or OSError) when it is unreadable."""
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"unknown voice file format {meta.get('format')!r}")
        fields = json.loads(meta["voice"])
        keys = set(f.keys())
        samples = f.get_tensor("samples")
        prompt = None
        if "x_vector" in keys:
            ref_codes = f.get_tensor("ref_codes") if "ref_codes" in keys else None
            prompt = VoicePrompt(f.get_tensor("x_vector"), ref_codes, fields.get("prompt_ref_text"))
    return StoredVoice(
        name=fields["name"],
        consent=fields["consent"],
        created_at=int(fields["created_at"]),
        mime_type=fields["mime_type"],
        file_size=int(fields["file_size"]),
        samples=samples.astype(np.float32, copy=False),
        sample_rate=int(fields["sample_rate"]),
        ref_text=fields.get("ref_text"),
        speaker_description=fields.get("speaker_description"),
        prompt=prompt,
        prompt_model=fields.get("prompt_model"),
    )


class VoiceStore:
    """Uploaded voices, in memory and (with ``directory``) on disk. Disk methods block: call them off the loop.

    The engine resolves voice names through it (:class:`omni_stream.validation.voices.VoiceCatalog`: ``get`` and
    ``names`` read memory only); a directory other servers share is read again by :meth:`refresh` first.
    """

    def __init__(self, directory: Path | None, max_voices: int = 1000) -> None:
        self.directory = directory
        self.max_voices = max_voices
        self._voices: dict[str, StoredVoice] = {}
        self._lock = threading.Lock()
        self._stamps: dict[str, tuple[int, int, int]] = {}  # (inode, mtime ns, size) of the file last read by refresh

    def __len__(self) -> int:
        return len(self._voices)

    def get(self, name: str) -> StoredVoice | None:
        return self._voices.get(name.lower())

    def voices(self) -> list[StoredVoice]:
        """Every uploaded voice, sorted by name."""
        return sorted(self._voices.values(), key=lambda v: v.key)

    def names(self) -> list[str]:
        """Every uploaded voice's name, lower-cased and sorted."""
        return sorted(self._voices)

    def has_room_for(self, name: str) -> bool:
        return name.lower() in self._voices or len(self._voices) < self.max_voices

    def load(self) -> int:
        """Restore the voices found on disk (and delete leftovers of interrupted writes); returns the count."""
        if self.directory is None:
            return 0
        self.directory.mkdir(parents=True, exist_ok=True)
        restored: dict[str, StoredVoice] = {}
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(TMP_PREFIX):
                path.unlink(missing_ok=True)
                continue
            if path.suffix != SUFFIX or not path.is_file():
                continue
            try:
                voice = read_voice(path)
            except Exception as exc:  # one bad file must not stop the server
                log.warning("skipping unreadable voice file %s: %s", path, exc)
                continue
            if path.stem != voice.key:
                log.warning("skipping voice file %s: it holds voice %r", path, voice.name)
                continue
            restored[voice.key] = voice
        with self._lock:
            self._voices = restored
        return len(restored)

    def save(self, voice: StoredVoice, original: bytes) -> bool:
        """Persist ``voice`` (atomically), replacing one of the same name; returns True when it replaced one."""
        data = encode_voice(voice, original)
        with self._lock:
            replaced = voice.key in self._voices
            if not replaced and len(self._voices) >= self.max_voices:
                raise VoiceLimitError(f"Maximum number of uploaded voices ({self.max_voices}) reached")
            if self.directory is not None:
                self._write(voice.key, data)
            self._voices[voice.key] = voice
        return replaced

    def delete(self, name: str) -> StoredVoice | None:
        """Remove a voice; returns it, or None when there was none of that name."""
        key = name.lower()
        with self._lock:
            voice = self._voices.get(key)
            if voice is None:
                return None
            if self.directory is not None:
                (self.directory / f"{key}{SUFFIX}").unlink(missing_ok=True)
            del self._voices[key]
        return voice

    # --- a directory shared with other servers (replicas) ---

    def refresh(self, name: str) -> StoredVoice | None:
        """``name`` as the directory holds it now: read again when its file changed, forgotten when it is gone.

        Several servers sharing one directory see each other's uploads, replacements and deletions this way;
        an unchanged file costs one ``stat``. Blocking: call it off the loop.
        """
        if self.directory is None or validate_name(name) is not None:
            return self.get(name)
        key = name.lower()
        path = self.directory / f"{key}{SUFFIX}"
        with self._lock:
            try:
                st = path.stat()
            except FileNotFoundError:
                self._voices.pop(key, None)
                self._stamps.pop(key, None)
                return None
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._stamps.get(key) == stamp and key in self._voices:
                return self._voices[key]
            try:
                voice = read_voice(path)
            except Exception as exc:  # a foreign or damaged file: keep what this server had
                log.warning("skipping unreadable voice file %s: %s", path, exc)
                return self._voices.get(key)
            if voice.key != key:
                log.warning("skipping voice file %s: it holds voice %r", path, voice.name)
                return self._voices.get(key)
            self._voices[key] = voice
            self._stamps[key] = stamp
            return voice

    def sync(self) -> None:
        """Bring every voice in line with the directory (see :meth:`refresh`). Blocking: call it off the loop."""
        if self.directory is None or not self.directory.is_dir():
            return
        on_disk = {p.stem for p in self.directory.iterdir() if p.suffix == SUFFIX and not p.name.startswith(TMP_PREFIX)}
        for key in sorted(on_disk | set(self._voices)):
            self.refresh(key)

    def _write(self, key: str, data: bytes) -> None:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{key}-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.directory / f"{key}{SUFFIX}")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.directory)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def now_seconds() -> int:
    return int(time.time())
