"""Serving settings: limits, timeouts and paths, one frozen dataclass shared by every route."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from omni_stream.realtime.agent.limits import MAX_TEXT_CHARS
from omni_stream.vision.limits import FrameLimits

if TYPE_CHECKING:  # numpy and the codecs: not for `serve --help`
    from omni_stream.realtime.agent.trace import SessionTraces
    from omni_stream.turns.detector import TurnModelFactory
    from omni_stream.turns.vad import VadFactory

SPEECH_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
STREAM_FORMATS = ("pcm", "wav")


BATCH_MAX_ITEMS = 32  # items of one POST /v1/audio/speech/batch (vLLM-Omni's default)


def default_vad() -> VadFactory | None:
    """The server VAD some family provides (role ``"vad"``: Silero VAD's folder declares it), one per session."""
    from omni_stream.family_registry import VAD, serving_default  # the registry imports torch: not for `serve --help`

    return serving_default(VAD)


def default_turn_model() -> TurnModelFactory | None:
    """The end-of-turn model some family provides for ``semantic_vad`` (role ``"turn_model"``: Smart Turn's folder
    declares it where its model file and onnxruntime are installed), else None (no ``semantic_vad``)."""
    from omni_stream.family_registry import TURN_MODEL, serving_default

    return serving_default(TURN_MODEL)


def default_voices_dir(cache_dir: Path | None = None) -> Path:
    """Where uploaded voices live unless ``--voices-dir`` says otherwise: ``voices`` in ``cache_dir``
    (``Tuning.cache_dir``, ``$OMNI_STREAM_CACHE``), else in the user cache dir (the embedded tiny checkpoints live
    beside it)."""
    return Path(cache_dir or platformdirs.user_cache_dir("omni-stream")) / "voices"


@dataclass(slots=True, frozen=True)
class Settings:
    """Everything the serving layer needs besides the engine. Sizes in bytes, durations in seconds.

    Request bounds (text length, instructions, ``max_new_tokens``, reference audio seconds) are the engine's,
    in :mod:`omni_stream.speech.limits`; the limits here are the wire's (bodies, messages, uploads, queues).
    """

    # Identity and access
    model_name: str | None = None  # the served model id; None: the engine's own model name
    api_key: str | None = None  # None: no authentication
    voices_dir: Path | None = None  # None: no persistence (voices live in memory only)
    static_dir: Path | None = None  # None: realtime/static when it exists
    # Limits
    max_upload_bytes: int = 10 * 1024 * 1024
    max_voices: int = 1000
    max_ws_text_bytes: int = 128 * 1024
    max_ws_config_bytes: int = 4 * 1024 * 1024
    max_ws_pending_chars: int = 100_000  # text buffered in an open utterance, waiting for a unit boundary
    max_ws_queued_units: int = 64  # units of a session queued or synthesizing; more is refused until some finish
    max_ws_uncommitted_chars: int = 400  # text_input_mode="commitment": held text past this is committed anyway
    batch_max_items: int = BATCH_MAX_ITEMS
    # Reference audio sources: file paths only under this directory; URLs only when allowed
    allowed_local_media_path: Path | None = None
    allow_remote_media: bool = False
    remote_media_timeout: float = 10.0
    # WebSocket timeouts
    ws_config_timeout: float = 10.0
    ws_idle_timeout: float = 30.0
    # Streams behind a buffering proxy: seconds of audio a stream may run ahead of real-time playback
    # (omni_stream.speech.pacing); None: not paced, transport backpressure alone bounds it
    pace_streams_seconds: float | None = None
    # Set per replica when several serve one address: a ``replica`` label on /metrics, an x-omni-stream-replica header
    replica_id: str | None = None
    # Images (POST /v1/images/*): bytes per uploaded file, decoded pixels per image, files per request
    max_image_bytes: int = 10 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096
    max_image_files: int = 4  # input images and the mask
    # Transcriptions (POST /v1/audio/transcriptions): bytes of the uploaded file (OpenAI's 25 MB), seconds of audio
    # it may decode to (longer recordings are transcribed window by window: omni_stream.transcription.long_form)
    max_transcription_bytes: int = 25 * 1024 * 1024
    max_transcription_seconds: float = 1800.0
    # Video WebSocket (/v1/realtime/video): session.start within this many seconds; a session with neither
    # generation progress nor a client ping for video_stall_timeout seconds is ended with a stall error
    video_start_timeout: float = 10.0
    video_stall_timeout: float = 60.0
    # Images and video frames a client shows a text model that sees (WS /v1/video/chat/stream, input_image parts
    # on WS /v1/realtime): bytes, pixels, the resolution cap, the rate cap, the window (omni_stream.vision.frames)
    frame_limits: FrameLimits = field(default_factory=FrameLimits)
    # WS /v1/video/chat/stream: a session with no message for this many seconds while no reply runs is ended
    # (vLLM-Omni's 60 s); a reply's tokens unless the session's sampling sets max_tokens (None: the model's context)
    video_chat_idle_timeout: float = 60.0
    video_chat_max_tokens: int | None = None
    # Benchmark-only request fields (``ignore_eos``): off on production servers, where they are a 400
    enable_benchmark_fields: bool = False
    # vLLM-Omni compatibility: ``stream=true`` without ``stream_format`` streams raw audio bytes, as vLLM-Omni
    # did before it switched to SSE (its bench_tts_serve.py and fastrtc demo count those bytes as PCM).
    legacy_stream_raw: bool = False
    # Realtime sessions (WS /v1/realtime and WebRTC)
    # VadParams -> VoiceActivityDetector for server_vad turn detection; None: manual commits only
    vad_factory: VadFactory | None = field(default_factory=default_vad)
    # () -> EndOfTurnModel for semantic_vad (beside vad_factory's detector); None: semantic_vad is refused
    turn_model_factory: TurnModelFactory | None = field(default_factory=default_turn_model)
    realtime_max_append_bytes: int = 15 * 1024 * 1024  # decoded audio per input_audio_buffer.append
    realtime_max_buffer_seconds: float = 300.0  # input audio a session holds before a commit
    realtime_max_items: int = 256  # conversation items kept (the oldest go first)
    realtime_max_text_chars: int = MAX_TEXT_CHARS  # characters of one text part of a conversation item
    realtime_session_seconds: float = 3600.0  # then error session_expired and close
    realtime_run_ahead_seconds: float = 2.0  # audio sent ahead of the client's real-time playback
    # Codec frames in each response unit's first audio chunk (Qwen3-TTS: 80 ms each). None: the speech model's own
    # choice (Qwen3-TTS: one frame while few streams run, more as the load grows so playback never runs dry). A
    # response's first unit is its first clause.
    realtime_first_codec_frames: int | None = None
    # Benchmarks only (with enable_benchmark_fields): a response's first unit ends after this many tokens at the
    # latest (SpokenReply.first_unit_tokens: a random-weight LM writes no clause boundary)
    realtime_bench_first_unit_tokens: int | None = None
    # Tokens a turn's transcript may take (None: the model's own budget, 448 for Whisper): a turn must fit the text
    # model beside the instructions (session.truncation drops older turns, never the newest). 128 Whisper tokens are
    # about 30 s of speech, Whisper's whole window; a random-weight ASR, which never ends a transcript, stops there.
    realtime_transcription_max_tokens: int | None = 128
    # Benchmarks only: each realtime session's timeline (when its turn's steps happened) collects here; None: off
    realtime_trace: SessionTraces | None = None
    rtc_concurrency_limit: int = 8  # WebRTC sessions at once (fastrtc answers more with concurrency_limit_reached)
    rtc_ice_servers: tuple[str, ...] = ()  # STUN/TURN URLs for WebRTC; none: host candidates only

    @property
    def max_speech_body_bytes(self) -> int:
        """Largest /v1/audio/speech JSON body: base64 reference audio at the upload limit plus the other fields."""
        return -(-self.max_upload_bytes * 4 // 3) + 64 * 1024

    def __post_init__(self) -> None:
        if self.max_voices < 0 or self.max_ws_queued_units < 1 or self.batch_max_items < 1:
            raise ValueError("limits must be positive")
        if self.realtime_transcription_max_tokens is not None and self.realtime_transcription_max_tokens < 1:
            raise ValueError("realtime_transcription_max_tokens must be at least 1")
        if self.max_transcription_bytes < 1 or self.max_transcription_seconds <= 0:
            raise ValueError("max_transcription_bytes and max_transcription_seconds must be positive")
        if self.max_ws_uncommitted_chars < 1:
            raise ValueError("max_ws_uncommitted_chars must be positive")
        timeouts = (self.ws_config_timeout, self.ws_idle_timeout, self.video_start_timeout, self.video_stall_timeout,
                    self.video_chat_idle_timeout)  # fmt: skip
        if min(timeouts) <= 0:
            raise ValueError("WebSocket timeouts must be positive")
        if self.pace_streams_seconds is not None and self.pace_streams_seconds < 0:
            raise ValueError("pace_streams_seconds must be >= 0 (None: not paced)")
