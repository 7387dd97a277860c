"""What one benchmark request sends and how it is timed: its text, exact length and voice, over each transport.

Shared by ``tts_bench.py`` (bursts of ``c`` requests) and ``tts_load.py`` (open-loop arrivals). A request is a
:class:`Spoken` (index, text, frames: EOS suppressed, so it yields exactly that many 80 ms frames) spoken with
the run's :class:`RequestFields`, whose ``mode`` says how the voice is given (:data:`VOICE_MODES`):

- ``custom``: a built-in voice of a CustomVoice checkpoint, the voices in turn;
- ``clone``: a Base checkpoint cloning in context: reference audio (``--ref-seconds`` of speech, a WAV data URL over
  the wire) and its transcript with every request, so the server extracts the x-vector and the reference's codec
  codes for each one and the talker prefills the reference codes;
- ``clone-xvec``: the same reference audio, ``x_vector_only_mode`` (the speaker embedding alone: no reference
  codes, a short prompt);
- ``voice`` / ``voice-xvec``: uploaded voices (``POST /v1/audio/voices`` once, in process
  ``engine.create_voice_prompt``): the prompt is extracted once and each request names the voice; ``voice``
  clones in context (the stored reference codes are prefilled), ``voice-xvec`` from the x-vector alone.

Reference clips are the project's recorded speech (``benchmarks/speech``) tiled to ``ref_seconds`` with a little
noise seeded by the clip's index, so clips differ; ``ref_pool`` = 0 gives every request its own clip (the server
can reuse nothing), N > 0 cycles N clips (and N uploaded voices).

Per request (:func:`request_record`): TTFA from the send to the first audio, x real time, underrun
(``omni_stream.metrics.underrun_of``), chunks and samples; a failed request in an open-loop run is recorded with
its error instead of ending the run.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import wave
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from omni_stream.metrics import underrun_of

HERE = Path(__file__).resolve().parent
VOICES = ("vivian", "serena", "uncle_fu", "ryan", "aiden", "ono_anna", "sohee", "eric", "dylan")
TEXT = "The quick brown fox jumps over the lazy dog while the evening sun sets slowly behind the quiet hills."
FRAME_S = 0.08
RATE = 24000
# Speech runs at ~14 characters a second; a request of s seconds speaks about 14 s characters of PASSAGE. Capped so
# its tokens (~0.76 a character for the benchmark checkpoints' tokenizer) stay under the runner's trailing-text
# capacity of 256 rows, past which it would re-capture its CUDA graphs mid-run.
CHARS_PER_SECOND = 14
MAX_CHARS = 300
PASSAGE = (
    "Every morning the harbour wakes before the town does. Fishing boats slide out past the lighthouse, their "
    "engines low, while the gulls argue over the nets. By seven the bakery on the corner has its door propped "
    "open, and the smell of bread drifts down to the water. Children walk to school along the sea wall, counting "
    "the boats they can still see. Later the tide turns, the wind picks up from the west, and the whole bay "
    "changes colour, from silver to a deep and restless green."
)
REF_TEXT = "Could you tell me the way to the station, please? I think I have missed my stop again."
SPEECH = (HERE / "speech" / "question.wav", HERE / "speech" / "interruption.wav")  # espeak-ng, int16 at 24 kHz

# mode -> (checkpoint kind, what each request sends)
VOICE_MODES = {
    "custom": ("custom_voice", "a built-in voice (CustomVoice)"),
    "clone": ("base", "reference audio + its transcript with every request (in-context clone)"),
    "clone-xvec": ("base", "reference audio with every request, x_vector_only_mode (speaker embedding alone)"),
    "voice": ("base", "an uploaded voice, its prompt extracted once (in-context clone)"),
    "voice-xvec": ("base", "an uploaded voice, x_vector_only_mode (speaker embedding alone)"),
}


@dataclass(frozen=True, slots=True)
class Spoken:
    """One request: ``index`` (its seed, its voice in turn), its text and its exact length in frames."""

    index: int
    text: str
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames * FRAME_S


def text_for(seconds: float) -> str:
    """About ``CHARS_PER_SECOND`` characters of speech a second, whole words, at most ``MAX_CHARS``."""
    want = min(MAX_CHARS, max(12, round(CHARS_PER_SECOND * seconds)))
    text = PASSAGE
    while len(text) < want:
        text = f"{text} {PASSAGE}"
    cut = text.rfind(" ", 0, want + 1)
    return text[: cut if cut > 0 else want].rstrip(" ,") + "."


def mode_kind(modes: list[str]) -> str:
    """The checkpoint kind every mode of ``modes`` runs on; ValueError when they need different ones."""
    unknown = [m for m in modes if m not in VOICE_MODES]
    if unknown:
        raise ValueError(f"unknown voice modes {unknown} (choose from {', '.join(VOICE_MODES)})")
    kinds = {VOICE_MODES[m][0] for m in modes}
    if len(kinds) != 1:
        raise ValueError(f"voice modes {modes} need different checkpoints ({', '.join(sorted(kinds))}): run them apart")
    return kinds.pop()


def _speech() -> np.ndarray:
    parts = []
    for path in SPEECH:
        with wave.open(str(path), "rb") as w:
            parts.append(np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768)
        parts.append(np.zeros(RATE // 5, np.float32))  # 200 ms between the utterances
    return np.concatenate(parts)


_SPEECH: np.ndarray | None = None


def reference_clip(index: int, seconds: float) -> np.ndarray:
    """``seconds`` of speech at 24 kHz, float32; clips of different ``index`` differ (seeded noise)."""
    global _SPEECH
    if _SPEECH is None:
        _SPEECH = _speech()
    n = round(seconds * RATE)
    clip = np.resize(_SPEECH, n)
    noise = np.random.default_rng(index).standard_normal(n).astype(np.float32)
    return np.clip(clip + 0.003 * noise, -1, 1)


def wav_bytes(samples: np.ndarray, rate: int = RATE) -> bytes:
    """16-bit mono WAV."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


@dataclass(slots=True)
class RequestFields:
    """The fields every request of a run carries beyond its text and length (see the module docstring)."""

    mode: str = "custom"
    ref_seconds: float = 6.0
    ref_pool: int = 0  # 0: every request its own reference clip; N: N clips (and N uploaded voices) in turn
    initial_frames: int | None = None  # initial_codec_chunk_frames (None: the engine's)
    uploaded: list[str] = field(default_factory=list)  # uploaded voice names (voice modes, over the server)
    prompts: list = field(default_factory=list)  # VoicePrompts (voice modes, in process)
    _data_urls: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        mode_kind([self.mode])

    @property
    def uploads(self) -> bool:
        return self.mode in ("voice", "voice-xvec")

    def clip_index(self, i: int) -> int:
        return i % self.ref_pool if self.ref_pool else i

    def _data_url(self, i: int) -> str:
        k = self.clip_index(i)
        url = self._data_urls.get(k)
        if url is None:
            url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(reference_clip(k, self.ref_seconds))).decode()
            if self.ref_pool:  # a pool is reused: keep its clips; unique clips are made once and dropped
                self._data_urls[k] = url
        return url

    def common(self, spoken: Spoken) -> dict:
        fields: dict = {"language": "English", "max_new_tokens": spoken.frames, "ignore_eos": True,
                        "seed": spoken.index}  # fmt: skip
        if self.initial_frames is not None:
            fields["initial_codec_chunk_frames"] = self.initial_frames
        return fields

    def wire(self, spoken: Spoken) -> dict:
        """JSON fields of the HTTP body or the WebSocket session.config (without ``input``)."""
        i, fields = spoken.index, self.common(spoken)
        if self.mode == "custom":
            return fields | {"voice": VOICES[i % len(VOICES)]}
        if self.uploads:
            name = self.uploaded[i % len(self.uploaded)]
            return fields | {"voice": name} | ({"x_vector_only_mode": True} if self.mode == "voice-xvec" else {})
        ref = {"task_type": "Base", "ref_audio": self._data_url(i)}
        if self.mode == "clone":
            return fields | ref | {"ref_text": REF_TEXT}
        return fields | ref | {"x_vector_only_mode": True}

    def engine(self, spoken: Spoken) -> dict:
        """``engine.speech()`` keyword fields (in process)."""
        i, fields = spoken.index, self.common(spoken)
        if self.mode == "custom":
            return fields | {"voice": VOICES[i % len(VOICES)]}
        if self.uploads:
            prompt = self.prompts[i % len(self.prompts)]
            if self.mode == "voice":
                return fields | {"voice_prompt": prompt}
            return fields | {"voice_prompt": replace(prompt, ref_codes=None), "x_vector_only_mode": True}
        ref = {"ref_audio": reference_clip(self.clip_index(i), self.ref_seconds), "ref_sample_rate": RATE}
        if self.mode == "clone":
            return fields | ref | {"ref_text": REF_TEXT}
        return fields | ref | {"x_vector_only_mode": True}

    def voices_needed(self) -> int:
        return max(1, self.ref_pool)

    async def upload(self, client, url: str) -> float:
        """Upload the voice modes' voices over ``POST /v1/audio/voices``; returns seconds per upload (mean)."""
        if not self.uploads or self.uploaded:
            return 0.0
        t0 = time.perf_counter()
        for k in range(self.voices_needed()):
            name = f"bench{k}"
            files = {"audio_sample": (f"{name}.wav", wav_bytes(reference_clip(k, self.ref_seconds)), "audio/wav")}
            data = {"name": name, "consent": "benchmark", "ref_text": REF_TEXT}
            response = await client.post(f"{url}/v1/audio/voices", files=files, data=data)
            if response.status_code != 200:
                raise RuntimeError(f"voice upload: HTTP {response.status_code}: {response.text}")
            self.uploaded.append(name)
        return (time.perf_counter() - t0) / self.voices_needed()

    async def extract(self, engine) -> float:
        """In process: extract the voice modes' prompts once; returns seconds per extraction (mean)."""
        if not self.uploads or self.prompts:
            return 0.0
        t0 = time.perf_counter()
        for k in range(self.voices_needed()):
            clip = reference_clip(k, self.ref_seconds)
            self.prompts.append(await engine.create_voice_prompt(clip, RATE, ref_text=REF_TEXT))
        return (time.perf_counter() - t0) / self.voices_needed()

    def describe(self) -> dict:
        return {
            "voice_mode": self.mode,
            "voice_mode_detail": VOICE_MODES[self.mode][1],
            "ref_seconds": self.ref_seconds if self.mode != "custom" else None,
            "ref_pool": self.ref_pool if self.mode != "custom" else None,
            "ref_codes_frames": round(self.ref_seconds * 12.5) if self.mode in ("clone", "voice") else 0,
        }


def request_record(t0: float, arrivals: list[float], durations: list[float], samples: int) -> dict:
    """One request's figures from its send time and its chunks' arrival times and audio seconds."""
    if not arrivals:
        raise RuntimeError("a request returned no audio")
    audio_s = sum(durations)
    return {
        "start": t0,
        "ttfa": arrivals[0] - t0,
        "end": arrivals[-1],
        "audio_s": audio_s,
        "xrt": audio_s / (arrivals[-1] - t0),
        "underrun": underrun_of(arrivals, durations),
        "chunks": len(arrivals),
        "samples": samples,
    }


# --- one request over each transport, from its send to its last chunk ---


async def inproc_request(engine, spoken: Spoken, fields: RequestFields) -> dict:
    kwargs = fields.engine(spoken)
    t0 = time.perf_counter()
    arrivals, durations, samples = [], [], 0
    async with engine.speech(spoken.text, **kwargs) as stream:
        async for audio in stream:
            arrivals.append(time.perf_counter())
            durations.append(audio.samples.shape[0] / audio.sample_rate)
            samples += audio.samples.shape[0]
    return request_record(t0, arrivals, durations, samples) | {"request_id": stream.request.request_id}


# Where an HTTP request's time to first audio goes on the client's side, from httpcore's trace events (ms after
# the send): its connection ready (a fresh pool per level: every request connects) and the request written. The
# rest is the server's (it reads and checks the body, creates the engine request, and sends its status line with
# the first audio, so an early error is a plain HTTP error). Run 25, c=32: TTFA 125 ms, of which the connection
# 13.5 ms and the request written 16.4 ms (p50), the engine's own TTFA 79 ms (a mean): the WebSocket benchmark
# connects before its clock, so HTTP's figure holds ~16 ms more of the client's work.
HTTP_PHASES = {
    "http11.send_request_headers.started": "connected",
    "http11.send_request_body.complete": "sent",
}


async def http_request(client, url: str, spoken: Spoken, fields: RequestFields) -> dict:
    body = {"input": spoken.text, "response_format": "pcm", "stream_format": "audio", **fields.wire(spoken)}
    arrivals, durations, size = [], [], 0
    marks: dict[str, float] = {}

    async def trace(event: str, info: dict) -> None:
        if event in HTTP_PHASES:
            marks[HTTP_PHASES[event]] = time.perf_counter()

    t0 = time.perf_counter()
    request = client.stream("POST", f"{url}/v1/audio/speech", json=body, extensions={"trace": trace})
    async with request as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')}")
        rate = int(response.headers["x-sample-rate"])
        async for data in response.aiter_raw():
            if data:
                arrivals.append(time.perf_counter())
                durations.append(len(data) / 2 / rate)  # int16 mono
                size += len(data)
    return request_record(t0, arrivals, durations, size // 2) | {f"{k}_s": v - t0 for k, v in marks.items()}


async def ws_request(ws_url: str, spoken: Spoken, fields: RequestFields, start: asyncio.Barrier | None = None) -> dict:
    """One utterance on its own session. ``start``: every session connects and configures, then all send at once
    (bursts); None: it sends as soon as its own session is configured (open loop: ``setup_s`` says how long the
    connection and the config took before the send, outside the TTFA)."""
    from websockets.asyncio.client import connect

    config = {"type": "session.config", "response_format": "pcm", "stream_audio": True, **fields.wire(spoken)}
    arrived = time.perf_counter()
    async with connect(f"{ws_url}/v1/audio/speech/stream", max_size=None, ping_interval=None) as ws:
        await ws.send(json.dumps(config))
        if start is not None:
            await start.wait()
        arrivals, durations, size, rate = [], [], 0, None
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "input.text", "text": spoken.text}))
        await ws.send(json.dumps({"type": "input.done"}))
        async for message in ws:
            if isinstance(message, bytes):
                arrivals.append(time.perf_counter())
                durations.append(len(message) / 2 / rate)
                size += len(message)
                continue
            event = json.loads(message)
            if event["type"] == "audio.start":
                rate = event["sample_rate"]
            elif event["type"] == "error" or event.get("error") is True:
                raise RuntimeError(f"WebSocket error: {event}")
            elif event["type"] == "session.done":
                break
    return request_record(t0, arrivals, durations, size // 2) | {"setup_s": t0 - arrived}
