"""Serving settings: limits, timeouts and paths, one frozen dataclass shared by every route."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
STREAM_FORMATS = ("pcm", "wav")


def default_voices_dir() -> Path:
    """Where uploaded voices live unless ``--voices-dir`` says otherwise (the user cache dir)."""
    return Path(platformdirs.user_cache_dir("omni-stream")) / "voices"


@dataclass(slots=True, frozen=True)
class Settings:
    """Everything the serving layer needs besides the engine. Sizes in bytes, durations in seconds."""

    # Identity and access
    model_name: str | None = None  # the served model id; None: the engine's own model name
    api_key: str | None = None  # None: no authentication
    voices_dir: Path | None = None  # None: no persistence (voices live in memory only)
    static_dir: Path | None = None  # None: realtime/static when it exists
    # Limits
    max_input_chars: int = 4096
    max_instructions_chars: int = 500
    max_new_tokens: int = 4096
    min_ref_seconds: float = 1.0
    max_ref_seconds: float = 30.0
    max_upload_bytes: int = 10 * 1024 * 1024
    max_voices: int = 1000
    max_ws_text_bytes: int = 128 * 1024
    max_ws_config_bytes: int = 4 * 1024 * 1024
    max_ws_pending_chars: int = 100_000  # text buffered in an open utterance, waiting for a unit boundary
    max_ws_queued_units: int = 64  # units of a session queued or synthesizing; more is refused until some finish
    # Reference audio sources: file paths only under this directory; URLs only when allowed
    allowed_local_media_path: Path | None = None
    allow_remote_media: bool = False
    remote_media_timeout: float = 10.0
    # WebSocket timeouts
    ws_config_timeout: float = 10.0
    ws_idle_timeout: float = 30.0
    # Benchmark-only request fields (``ignore_eos``): off on production servers, where they are a 400
    enable_benchmark_fields: bool = False
    # Realtime sessions (WS /v1/realtime and WebRTC)
    vad_factory: Callable[[Any], Any] | None = None  # VadParams -> VoiceActivityDetector; None: no server VAD
    realtime_max_append_bytes: int = 15 * 1024 * 1024  # decoded audio per input_audio_buffer.append
    realtime_max_buffer_seconds: float = 300.0  # input audio a session holds before a commit
    realtime_max_items: int = 256  # conversation items kept (the oldest go first)
    realtime_session_seconds: float = 3600.0  # then error session_expired and close
    realtime_run_ahead_seconds: float = 2.0  # audio sent ahead of the client's real-time playback
    rtc_concurrency_limit: int = 8  # WebRTC sessions at once (fastrtc answers more with concurrency_limit_reached)
    rtc_ice_servers: tuple[str, ...] = ()  # STUN/TURN URLs for WebRTC; none: host candidates only

    @property
    def max_speech_body_bytes(self) -> int:
        """Largest /v1/audio/speech JSON body: base64 reference audio at the upload limit plus the other fields."""
        return -(-self.max_upload_bytes * 4 // 3) + 64 * 1024

    def __post_init__(self) -> None:
        if self.max_input_chars < 1 or self.max_new_tokens < 1 or self.max_voices < 0 or self.max_ws_queued_units < 1:
            raise ValueError("limits must be positive")
        if not 0 < self.min_ref_seconds <= self.max_ref_seconds:
            raise ValueError("min_ref_seconds must be in (0, max_ref_seconds]")
        if self.ws_config_timeout <= 0 or self.ws_idle_timeout <= 0:
            raise ValueError("WebSocket timeouts must be positive")
