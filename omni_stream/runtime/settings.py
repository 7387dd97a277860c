"""The one tuning object: every ``OMNI_STREAM_*`` switch, parsed once from the environment and the command line.

:class:`Tuning` is a frozen dataclass. ``Tuning.from_env()`` reads every switch of :data:`SWITCHES` from the
environment (flags given as ``overrides`` win over it); the engine parses it once when it loads (unless it is
handed one), passes it to every family in ``LoadOptions.tuning``, and ``omni-stream serve`` prints it in its start
banner. Families and runtime code read its fields; nothing else in the package reads ``os.environ`` for a switch.

One vocabulary per kind of value, one parser each, one error message each, naming the variable (or the field, or
the ``--tune`` flag) and the values it takes:

- on/off switches take ``on`` or ``off`` (the older spellings ``1`` and ``0`` are still accepted);
- counts, milliseconds and choices name their range or their choices;
- sets take a comma-separated list (``none`` for the empty set).

A field left None means "the code's own choice" (e.g. ``step_ahead`` None: on for CUDA devices); its docstring
line says which.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from omni_stream.errors import ConfigError
from omni_stream.runtime.offload import PREPARE_THREADS
from omni_stream.speech.admission import DEFAULT_HOLD_S

# Bounds that are facts of the code a switch controls, kept here so that parsing a switch imports nothing heavy.
SMALL_ROW_TILE = 16  # the Triton small-batch projection's row tile: at most this many rows take it
PDL_KERNELS = frozenset({"norm", "rope", "attention", "silu", "linear", "sample", "prefetch"})
CODEC_DILATIONS = frozenset({3, 9})  # the Qwen3-TTS codec's dilated residual units (its 1, 3, 9 less the 1)
CODEC_STREAMS = ("high", "normal", "off")
DEVICE_POLICIES = ("deadlines", "rounds")  # omni_stream.device_policy: by class and deadline, or plain rounds
# semantic_vad's end-of-turn model: onnxruntime on the CPU, torch on the GPU, or auto (the GPU where there is one)
TURN_MODEL_DEVICES = ("auto", "cpu", "cuda")


# --- value kinds: parse a raw string, check a typed value, print it back -------------------------------------


@dataclass(frozen=True, slots=True)
class _Kind:
    """How one kind of value is spelled. ``expected`` completes "X must be ..." in every error message."""

    expected: str
    parse: Callable[[str], Any]  # raw (stripped, non-empty) -> value; ValueError when malformed
    valid: Callable[[Any], bool]
    show: Callable[[Any], str] = str


def _on_off(raw: str) -> bool:
    value = raw.lower()
    if value in ("on", "1"):
        return True
    if value in ("off", "0"):
        return False
    raise ValueError(raw)


ON_OFF = _Kind("on or off", _on_off, lambda v: isinstance(v, bool), lambda v: "on" if v else "off")


def _whole(lo: int, hi: int) -> _Kind:
    def parse(raw: str) -> int:
        if not (raw.isascii() and raw.isdigit()):
            raise ValueError(raw)
        return int(raw)

    def valid(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    return _Kind(f"a whole number within {lo}..{hi}", parse, valid)


def _milliseconds(most: float, *, least: float = 0) -> _Kind:
    def valid(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and least <= v <= most

    return _Kind(f"a number of milliseconds within {least:g}..{most:g}", float, valid, lambda v: f"{v:g}")


def _choice(choices: tuple[str, ...]) -> _Kind:
    return _Kind(f"one of {', '.join(choices)}", str.lower, lambda v: v in choices)


def _subset(allowed: frozenset[Any], item: Callable[[str], Any], *, all_words: tuple[str, ...] = ()) -> _Kind:
    """A comma-separated subset of ``allowed``; ``none`` (and ``off``/``0`` where ``all_words`` are given) the empty
    set, each of ``all_words`` the whole of it."""
    names = ", ".join(str(a) for a in sorted(allowed))
    words = "on (all), off (none)" if all_words else "none"

    def parse(raw: str) -> frozenset[Any]:
        low = raw.lower()
        if low in all_words:
            return allowed
        if low == "none" or (all_words and low in ("off", "0")):
            return frozenset()
        return frozenset(item(p.strip()) for p in raw.split(",") if p.strip())

    def valid(v: Any) -> bool:
        return isinstance(v, frozenset) and v <= allowed

    def show(v: frozenset[Any]) -> str:
        return ",".join(str(x) for x in sorted(v)) or "none"

    return _Kind(f"{words} or a comma-separated list of {names}", parse, valid, show)


def _int_item(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(raw)
    return int(raw)


TEXT = _Kind("a string", str, lambda v: isinstance(v, str))


def _directory(raw: str) -> Path:
    path = Path(raw).expanduser()  # "~/cache" is the home's, as a shell would read it
    if path.exists() and not path.is_dir():
        raise ValueError(raw)
    return path


PATH = _Kind("a directory path (not a file)", _directory, lambda v: isinstance(v, Path) and not v.is_file(), str)


@dataclass(frozen=True, slots=True)
class Switch:
    """One switch: the :class:`Tuning` field it sets, its environment variable and its kind of value."""

    name: str
    env: str
    kind: _Kind
    secret: bool = False  # never printed (the API key)

    def parse(self, raw: str, source: str | None = None) -> Any:
        """``raw`` as this switch's value; a ConfigError naming ``source`` (default: the variable) else."""
        text = raw.strip()
        if text.lower() == "auto" and self.name in _OPTIONAL and self.name not in _NO_AUTO:
            return None  # what describe() prints for the code's own choice, so a printed value can be given back
        try:
            value = self.kind.parse(text)
        except ValueError:
            value = _INVALID
        if value is _INVALID or not self.kind.valid(value):
            shown = "<hidden>" if self.secret else repr(raw)
            raise ConfigError(f"{source or self.env} must be {self.kind.expected}, got {shown}")
        return value


_INVALID = object()


# --- the tuning object ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tuning:
    """Every process switch, with its default. Build it with :meth:`from_env`; ``replace()`` it to change one.

    Units: milliseconds where the name says ``_ms``; counts of threads or rows otherwise.
    """

    # Paths and access
    cache_dir: Path | None = None  # embedded checkpoints and default voices dir; None: the user cache directory
    api_key: str | None = field(default=None, repr=False)  # default of serve --api-key; None: no key
    # Threads
    threads: int | None = None  # torch intra-op threads of the device worker; None: every core but one
    prepare_threads: int = PREPARE_THREADS  # threads per event loop that build prompts (runtime/offload.py)
    switch_interval_ms: float = 0.5  # the interpreter's thread switch interval on CUDA; 0 leaves it alone
    # Decoder layers on CUDA (the talker, the code predictor, the causal LM)
    fused: bool = True  # Triton kernels around the GEMMs; off: the plain module path (comparisons)
    small_rows: int = SMALL_ROW_TILE  # projections of at most this many rows through the Triton small-batch kernel
    predictor_small_rows: int | None = None  # the same for the code predictor alone; None: as small_rows
    predictor_kernel: bool = False  # a one-row code-predictor frame as one persistent kernel (run 26: slower)
    pdl: frozenset[str] = PDL_KERNELS  # kernels launched while their predecessor runs (Hopper and later)
    # The Qwen3-TTS codec on CUDA
    codec_stream: str = "high"  # windows on a stream of their own of this priority, or (off) on the talker's
    codec_phases: frozenset[int] = CODEC_DILATIONS  # dilated convolutions computed over their input's phases
    codec_channels_last: bool | None = None  # None: channel-major exactly when every dilation runs over phases
    # The Qwen3-TTS talker's scheduling
    step_ahead: bool | None = None  # launch each step before handing out the last one's frames; None: on CUDA
    admission: bool = False  # playback-paced admission of newcomers (omni_stream.speech.admission)
    burst_hold_ms: float = 1000 * DEFAULT_HOLD_S  # newcomers wait at most this long for their burst's prompts
    # The Qwen3-TTS talker's latency levers under open-loop load (benchmarks/tts_load.py --retune). On by default
    # since run 43 measured both together on one H200 engine (1.7B, in process): c=1 TTFA 19.9 -> 15.0 ms, c=32
    # 87 -> 65 ms, Poisson 2-20 s requests at 20/s p95 59 -> 51 ms and at 40/s 533 -> 429 ms, every stream continuous
    admit_after_collect: bool = True  # stepping ahead: the step in flight is collected before newcomers are picked
    first_window_wait_ms: float = 3.0  # the worker waits this long at most for first audio windows a step completes
    prefill_budget: int = 0  # prompt positions prefilled per step at most, longer prompts in chunks; 0: no limit
    voice_cache: int = 0  # voice prompts kept by their reference audio's content (Base); 0: none
    # The device worker's order across models (omni_stream.device_policy)
    device_policy: str = "deadlines"  # realtime work by deadline before throughput work; rounds: all once a round
    throughput_wait_ms: float = 500.0  # the fairness bound: the longest runnable throughput work waits for a step
    throughput_stream: bool = True  # on CUDA, image and video steps on a side stream of their own
    realtime_priority: bool = False  # on CUDA, realtime work on a stream of higher priority than image and video
    throughput_fence: bool = False  # on CUDA, an image or video step starts once the last one's device work is done
    realtime_streams: bool = False  # on CUDA, each realtime model's steps on a stream of its own (overlapping)
    # A realtime model whose requests are this far ahead in virtual time of the most-behind model's (requests no
    # listener plays yet: created + steps * the model's own step time) sits a round out, for at most 50 ms; 0: every
    # realtime model steps every round (omni_stream.device_policy). Off by default: measured at 50 with a fixed 10 ms
    # quantum on one H100 (0c17bc3, the same calls at 0), voice_bench run 61: v2v p95 at 16 sessions 627 -> 574 ms, at
    # 32 966 -> 914 (means of three rounds, one round of each level worse); chat_bench run 62: first audio p95 at c=16
    # 234 -> 275 ms (the LM's steps were shorter than the quantum, so its virtual time ran ahead of the clock), at c=4
    # 121 -> 110. The model's own step time as the quantum followed, not measured yet
    realtime_lead_ms: float = 0.0
    # A realtime model none of whose requests is due, one waiting on a downstream model's first audio (an answer's
    # text once its first spoken unit went to speech), sits a round out while another has work due now, for at most
    # 50 ms (omni_stream.device_policy). Off: on one H200 (voice_bench run 63, against off in the same call) the voice
    # agent's v2v p95 was 662 against 677 ms at 16 sessions (within the spread) and 994 against 907 at 32
    realtime_handoff_yield: bool = False
    # Native text models: newcomers prefilled together at static (batch, length) bucket shapes, CUDA graphs on CUDA
    # (omni_stream.models.causal_lm.runner). voice_bench run 45, the same call off / on: a 16-session voice turn's
    # LM phase 381 -> 142 ms, v2v p95 897 -> 685 ms; at 32 sessions 422 -> 226 ms, 1150 -> 1090 ms
    group_prefill_graphs: bool = True
    # Realtime sessions: where semantic_vad's end-of-turn model runs (omni_stream.models.smart_turn): onnxruntime on
    # the CPU, its graph by torch on the GPU, or auto: the GPU where there is one (read when the model loads)
    turn_model_device: str = "auto"
    # Whisper newcomers wait at most this long for utterances still being prepared (their features), so pauses that
    # arrive together (many sessions pausing at once) share one encoder pass; a lone utterance never waits. None:
    # 50 ms on CUDA, where a pass's cost is mostly fixed (asr_bench on the H200: 21.6 ms for one utterance, 6.6 ms an
    # utterance in a pass of 32), 0 elsewhere (on a CPU a pass costs about the same per utterance at any batch)
    transcription_hold_ms: float | None = None
    # Whisper's smallest encoder window: an utterance is encoded in the smallest of this window doubling (up to the
    # model's 30 s) that holds it and 2 s more, and its decoder reads those frames alone (whisper.cpp's audio_ctx). A
    # pass over 32 utterances costs 212 ms at 30 s on the H200 (asr_bench), about a third at 10 s. Whisper was
    # trained on 30 s windows, so on its own weights this trades accuracy (too short a window can keep a transcript
    # from stopping); models fine-tuned for short windows are made for it. None: every utterance in the whole window
    transcription_window_ms: float | None = None

    def __post_init__(self) -> None:
        for switch in SWITCHES:
            value = getattr(self, switch.name)
            if isinstance(value, set | list | tuple):  # a set given as any collection
                value = frozenset(value)
                object.__setattr__(self, switch.name, value)
            if value is None and switch.name in _OPTIONAL:
                continue
            if not switch.kind.valid(value):
                shown = "<hidden>" if switch.secret else repr(value)
                raise ConfigError(f"{switch.name} must be {switch.kind.expected}, got {shown}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Tuning:
        """Every switch from ``env`` (default: ``os.environ``; unset or blank: the default), then ``overrides``
        (typed field values, e.g. from flags; None leaves the environment's value)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for switch in SWITCHES:
            raw = env.get(switch.env, "")
            if raw.strip():
                values[switch.name] = switch.parse(raw)
        old = env.get(OLD_NO_FUSED, "")
        if old.strip():
            fused = not SWITCH_BY_NAME["fused"].parse(old, OLD_NO_FUSED)
            if values.get("fused", fused) != fused:
                raise ConfigError(f"{OLD_NO_FUSED} and OMNI_STREAM_FUSED disagree: set OMNI_STREAM_FUSED alone")
            values["fused"] = fused
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls(**values)

    def with_assignments(self, assignments: Iterable[str], flag: str = "--tune") -> Tuning:
        """This tuning with ``NAME=VALUE`` assignments applied (field names, environment spelling of values; a blank
        VALUE: the default)."""
        changes: dict[str, Any] = {}
        for text in assignments:
            name, sep, raw = text.partition("=")
            switch = SWITCH_BY_NAME.get(name.strip().replace("-", "_"))
            if not sep or switch is None or switch.secret:
                known = ", ".join(s.name for s in SWITCHES if not s.secret)
                raise ConfigError(f"{flag} takes NAME=VALUE with NAME one of: {known}; got {text!r}")
            blank = getattr(_DEFAULTS, switch.name)  # VALUE left blank: the default
            changes[switch.name] = switch.parse(raw, f"{flag} {switch.name}") if raw.strip() else blank
        return replace(self, **changes)

    def describe(self) -> str:
        """Every switch as ``name=value`` in the environment's spelling (the API key left out; None: ``auto``)."""
        parts = []
        for switch in SWITCHES:
            if switch.secret:
                continue
            value = getattr(self, switch.name)
            parts.append(f"{switch.name}={'auto' if value is None else switch.kind.show(value)}")
        return " ".join(parts)


OLD_NO_FUSED = "OMNI_STREAM_NO_FUSED"  # the older, negative spelling of OMNI_STREAM_FUSED (on: not fused)

SWITCHES: tuple[Switch, ...] = (
    Switch("cache_dir", "OMNI_STREAM_CACHE", PATH),
    Switch("api_key", "OMNI_STREAM_API_KEY", TEXT, secret=True),
    Switch("threads", "OMNI_STREAM_THREADS", _whole(1, 4096)),
    Switch("prepare_threads", "OMNI_STREAM_PREPARE_THREADS", _whole(1, 64)),
    Switch("switch_interval_ms", "OMNI_STREAM_SWITCH_INTERVAL_MS", _milliseconds(1000)),
    Switch("fused", "OMNI_STREAM_FUSED", ON_OFF),
    Switch("small_rows", "OMNI_STREAM_SMALL_ROWS", _whole(0, SMALL_ROW_TILE)),
    Switch("predictor_small_rows", "OMNI_STREAM_PREDICTOR_SMALL_ROWS", _whole(0, SMALL_ROW_TILE)),
    Switch("predictor_kernel", "OMNI_STREAM_PREDICTOR_KERNEL", ON_OFF),
    Switch("pdl", "OMNI_STREAM_PDL", _subset(PDL_KERNELS, str.lower, all_words=("on", "1"))),
    Switch("codec_stream", "OMNI_STREAM_CODEC_STREAM", _choice(CODEC_STREAMS)),
    Switch("codec_phases", "OMNI_STREAM_CODEC_PHASES", _subset(CODEC_DILATIONS, _int_item)),
    Switch("codec_channels_last", "OMNI_STREAM_CODEC_CHANNELS_LAST", ON_OFF),
    Switch("step_ahead", "OMNI_STREAM_STEP_AHEAD", ON_OFF),
    Switch("admission", "OMNI_STREAM_ADMISSION", ON_OFF),
    Switch("burst_hold_ms", "OMNI_STREAM_BURST_HOLD_MS", _milliseconds(1000)),
    Switch("admit_after_collect", "OMNI_STREAM_ADMIT_AFTER_COLLECT", ON_OFF),
    Switch("first_window_wait_ms", "OMNI_STREAM_FIRST_WINDOW_WAIT_MS", _milliseconds(50)),
    Switch("prefill_budget", "OMNI_STREAM_PREFILL_BUDGET", _whole(0, 1 << 16)),
    Switch("voice_cache", "OMNI_STREAM_VOICE_CACHE", _whole(0, 1 << 16)),
    Switch("device_policy", "OMNI_STREAM_DEVICE_POLICY", _choice(DEVICE_POLICIES)),
    Switch("throughput_wait_ms", "OMNI_STREAM_THROUGHPUT_WAIT_MS", _milliseconds(60000)),
    Switch("throughput_stream", "OMNI_STREAM_THROUGHPUT_STREAM", ON_OFF),
    Switch("realtime_priority", "OMNI_STREAM_REALTIME_PRIORITY", ON_OFF),
    Switch("throughput_fence", "OMNI_STREAM_THROUGHPUT_FENCE", ON_OFF),
    Switch("realtime_streams", "OMNI_STREAM_REALTIME_STREAMS", ON_OFF),
    Switch("realtime_lead_ms", "OMNI_STREAM_REALTIME_LEAD_MS", _milliseconds(10000)),
    Switch("realtime_handoff_yield", "OMNI_STREAM_REALTIME_HANDOFF_YIELD", ON_OFF),
    Switch("group_prefill_graphs", "OMNI_STREAM_GROUP_PREFILL_GRAPHS", ON_OFF),
    Switch("turn_model_device", "OMNI_STREAM_TURN_MODEL_DEVICE", _choice(TURN_MODEL_DEVICES)),
    Switch("transcription_hold_ms", "OMNI_STREAM_TRANSCRIPTION_HOLD_MS", _milliseconds(1000)),
    Switch("transcription_window_ms", "OMNI_STREAM_TRANSCRIPTION_WINDOW_MS", _milliseconds(30000, least=1000)),
)
SWITCH_BY_NAME = {s.name: s for s in SWITCHES}
# Fields whose None means "the code's own choice" (each field's comment says which)
_OPTIONAL = frozenset(
    {"cache_dir", "api_key", "threads", "predictor_small_rows", "codec_channels_last", "step_ahead",
     "transcription_hold_ms", "transcription_window_ms"}
)  # fmt: skip
_NO_AUTO = frozenset({"cache_dir", "api_key"})  # "auto" is a directory or a key there, not the default
assert {f.name for f in fields(Tuning)} == set(SWITCH_BY_NAME), "every Tuning field is a switch"
_DEFAULTS = Tuning()


def cache_dir_from_env(env: Mapping[str, str] | None = None) -> Path | None:
    """``$OMNI_STREAM_CACHE`` alone (for code that builds an embedded checkpoint outside an engine)."""
    raw = (os.environ if env is None else env).get(SWITCH_BY_NAME["cache_dir"].env, "")
    return SWITCH_BY_NAME["cache_dir"].parse(raw) if raw.strip() else None
