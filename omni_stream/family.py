"""The model-family contract: what a family is told when it loads, what it says about itself, how it registers.

A *family* is one folder under ``omni_stream/models/`` (or a third-party package) that turns a checkpoint into
stages. Both the engine and every family import this module; it imports neither.

Declaration. A family says what it is in its folder's ``declaration.py`` (:class:`FamilyDeclaration`: its label,
kind, model types and loader, embedded default, checkpoint writers and the serving defaults it provides);
:mod:`omni_stream.family_registry` finds the declarations, so that adding a family means writing one folder.
A loader runs off the event loop as ``loader(LoadContext) -> family``.

Kinds. Every family has ``info: ModelInfo``; ``info.kind`` says which role protocol it implements and so which
pipelines it can serve (the explicit list of kinds: :mod:`omni_stream.kinds`): :class:`SpeechFamily` (text ->
audio), :class:`TextFamily` (messages -> text deltas), and one per kind folder (transcription, images, video).
Speech-only vocabulary (tasks, voices, languages, sample rate) lives in :class:`SpeechInfo`, which speech families
provide; a family's own words (a prompt layout, a sampler of its own) travel in its own options object
(``SpeechRequest.options``), never in the engine's request types.

Model work runs on ``LoadContext.worker`` (one thread per device, shared by every family of the engine): schedulers
attach to it, one-off and batchable jobs go through ``submit`` / ``submit_batched``; stages await those futures with
``ctx.wait(future, what)`` so that every wait has a deadline. A batched stage holds its sequence with
``async with scheduler.session(payload, ctx)``, which registers a synchronous release on ``ctx``: aborting a request
hands the slot back before the worker's next step, without awaiting anything (all of a request's slots, in every
model, under the worker's lock at once: :mod:`omni_stream.context`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from omni_stream.chunks import Audio, TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.metrics import EngineMetrics
from omni_stream.pipeline import Chain, Stage
from omni_stream.requests import SpeechRequest, TaskType, TextRequest, VoicePrompt
from omni_stream.runtime.load_display import ProgressBar
from omni_stream.runtime.settings import Tuning
from omni_stream.validation.fields import whole
from omni_stream.worker import DeviceWorker


class ModelKind(StrEnum):
    """What a model does; also the role it fills in an engine (one model per kind)."""

    SPEECH = "speech"  # text -> audio (TTS)
    TEXT = "text"  # messages -> text (LLM)
    TRANSCRIPTION = "transcription"  # audio -> text (ASR)
    IMAGE = "image"  # text (+ image) -> image (diffusion)
    VIDEO = "video"  # text (+ image) -> video frames


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """What any loaded checkpoint says about itself. ``kind``: a :class:`ModelKind` value (or a family's own)."""

    model_name: str
    model_type: str
    kind: str


@dataclass(slots=True, frozen=True)
class SpeechInfo(ModelInfo):
    """A speech model: its tasks, built-in voices, languages, output ``sample_rate`` (Hz) and the longest text one
    request may carry (``max_input_chars``: streamed text is cut into units no longer than that).

    What requests are checked against (:mod:`omni_stream.validation.speech`): ``speaker_embedding_dim``, the size of
    a cloning prompt's x-vector (None: any); ``options``, the type of the family's own request options
    (``SpeechRequest.options``, a dataclass the family owns; None: it takes none)."""

    task_types: tuple[TaskType, ...] = ()
    voices: tuple[str, ...] = ()
    languages: tuple[str, ...] = ()
    sample_rate: int = 24000
    default_task: TaskType = TaskType.CUSTOM_VOICE
    default_voice: str | None = None
    max_input_chars: int = 1000
    speaker_embedding_dim: int | None = None
    options: type | None = None


@dataclass(slots=True, frozen=True)
class TextInfo(ModelInfo):
    """A text model: ``max_context`` positions (prompt + generated tokens); ``context_known`` False when that is a
    guess (a remote server that did not say), so ``max_tokens`` is left for the model's own server to check."""

    max_context: int = 2048
    context_known: bool = True
    sees_images: bool = False  # takes images in user messages (ChatMessage.images)


def check_device(device: str) -> None:
    """ConfigError unless ``device`` names a device this process can use (``"cpu"``, ``"cuda"``, ``"cuda:1"``)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ConfigError(f"device {device!r}: {why} (torch {torch.__version__}); use device='cpu'")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif parsed.type != "cpu":
        raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


@dataclass(slots=True, frozen=True)
class LoadOptions:
    """How to load. ``max_buffered_frames``: items a request's scheduler buffer holds before it pauses (backpressure).

    ``backend_args`` are passed through unchanged to a family that wraps another engine (e.g. vLLM engine args).
    ``tuning``: the process switches (:class:`~omni_stream.runtime.settings.Tuning`); families read its fields,
    never the environment.
    """

    device: str = "cpu"
    dtype: torch.dtype | str | None = None  # None: the family's default for the device
    load_format: str = "auto"  # "auto" | "safetensors" | "dummy" (random weights at real sizes)
    max_batch_size: int = 32
    max_buffered_frames: int = 25  # the scheduler's high watermark: 2 s of 80 ms speech frames
    progress: bool = True
    backend_args: tuple[tuple[str, object], ...] = ()
    tuning: Tuning = field(default_factory=Tuning)

    def __post_init__(self) -> None:
        check_device(self.device)
        for name in ("max_batch_size", "max_buffered_frames"):
            try:
                object.__setattr__(self, name, whole(getattr(self, name), name, low=1))
            except InvalidRequestError as exc:  # an option, not a request: a ConfigError in the same words
                raise ConfigError(exc.message) from None

    def progress_bar(self, total: int | None = None, desc: str = "loading", unit: str = "it") -> ProgressBar:
        """A tqdm bar (disabled when ``progress`` is False, and when its stream, stderr, is not a terminal: a log
        file would get every redraw, and log lines run onto the bar's); use it as a context manager."""
        from tqdm.auto import tqdm

        disable = None if self.progress else True  # None: tqdm's own check for a terminal
        bar: ProgressBar = tqdm(total=total, desc=desc, unit=unit, disable=disable, leave=False)
        return bar


@dataclass(slots=True, frozen=True)
class LoadContext:
    """Everything a family loader gets: the checkpoint (or endpoint), its parsed config, options, worker, metrics."""

    checkpoint: Path
    config: dict[str, Any]
    options: LoadOptions
    worker: DeviceWorker
    metrics: EngineMetrics
    # Families that serve from elsewhere (an OpenAI-compatible server) get its base URL here.
    endpoint: str | None = None


@runtime_checkable
class Family(Protocol):
    """Every family: its info, and ``aclose()`` to free what it holds (the engine stops the worker after)."""

    info: ModelInfo

    async def aclose(self) -> None: ...


@runtime_checkable
class SpeechFamily(Protocol):
    """``kind == "speech"``: text in, :class:`~omni_stream.chunks.Audio` out.

    ``speech_stages`` returns the stages of one request (a :class:`~omni_stream.pipeline.Chain` from a first stage
    that ignores its upstream to one that yields Audio: talker, then codec), resolved and checked by the engine before
    (:func:`omni_stream.validation.speech.resolve_speech`: its task, voice and language are set and valid); they
    count usage in ``ctx.tokens("speech")`` (text tokens in,
    codec frames out; tokenization runs off the loop inside the stages) and the last one yields ``Audio``, its last
    chunk marked ``final``. ``request.text`` is always a string here (streamed text is split into units first).
    """

    info: SpeechInfo

    def speech_stages(self, request: SpeechRequest, ctx: RequestContext) -> Chain[object, Audio]: ...

    async def create_voice_prompt(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None = None
    ) -> VoicePrompt:
        """The cloning prompt of ``audio`` (float32 mono, checked by the engine: its length within the bounds)."""
        ...

    def count_text_tokens(self, text: str) -> int: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class TextFamily(Protocol):
    """``kind == "text"``: a text generator. ``text_stage`` returns one ``Stage[object, TextDelta]``.

    ``max_tokens`` has been checked against ``info.max_context`` by the engine; the stage fits the tokenized prompt
    to the context with :func:`omni_stream.validation.text.fit_prompt`. The stage ignores its upstream, counts
    ``ctx.tokens("text")`` (prompt tokens in, generated tokens out) and marks its last delta ``final`` with a
    ``finish_reason``. Closing it (any exit) aborts the generation.
    """

    info: TextInfo

    def text_stage(self, request: TextRequest, ctx: RequestContext) -> Stage[object, TextDelta]: ...

    def count_text_tokens(self, text: str) -> int: ...

    async def aclose(self) -> None: ...


# --- declaring a family -----------------------------------------------------------------------------------------

FamilyLoader = Callable[[LoadContext], Family]
Target = str | Callable[..., object]  # an object, or the "module[:attr]" path it is imported from when first asked for


@dataclass(slots=True, frozen=True)
class FamilyDeclaration:
    """What a family says about itself before anything loads (its folder's ``declaration.py``: ``FAMILIES``).

    ``name``: unique, usually the folder's; ``label``: how messages name it (``"Qwen3-TTS"``); ``kind``: the
    :class:`ModelKind` (or a plugin kind) its models serve, None for a folder that only provides serving defaults;
    ``model_types``: the ``config.json`` ``model_type`` values (or backend names) its ``loader`` takes
    (``loader(LoadContext) -> family``; a path's attribute defaults to ``load_family``); ``embedded_default``:
    ``build(cache_dir) -> Path`` of the tiny random-weight checkpoint its kind serves when no model is given (one
    family per kind); ``writers``: the ``omni-stream make-checkpoint --kind`` names it writes, each
    ``writer(args) -> Path``; ``serves``: the serving layer's defaults it provides, by role (a provider ``() ->
    object | None``; :func:`omni_stream.family_registry.serving_default` lists the roles).
    """

    name: str
    label: str
    kind: str | None = None
    model_types: tuple[str, ...] = ()
    loader: FamilyLoader | str | None = None
    embedded_default: Target | None = None
    writers: Mapping[str, Target] = field(default_factory=dict)
    serves: Mapping[str, Target] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_types and self.loader is None:
            raise ConfigError(f"family {self.name}: model_types {self.model_types} need a loader")
        if self.embedded_default is not None and self.kind is None:
            raise ConfigError(f"family {self.name}: an embedded default needs the kind it serves")


def read_config(path: Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory; ConfigError when it is missing or names no model_type.

    A diffusers pipeline directory has ``model_index.json`` instead: its ``_class_name`` (e.g. ``HeliosPipeline``)
    is the model type.
    """
    if not path.exists():  # a mistyped path: say so, not that some file inside it is missing
        raise ConfigError(f"{path} does not exist: give a checkpoint's directory (the one holding config.json)")
    if path.is_file():
        raise ConfigError(f"{path} is a file: give the checkpoint's directory (the one holding config.json)")
    config_file = path / "config.json"
    index_file = path / "model_index.json"
    if not config_file.is_file() and index_file.is_file():
        try:
            index = json.loads(index_file.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {index_file}: {exc}") from exc
        if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
            raise ConfigError(f"{index_file} has no _class_name")
        return {**index, "model_type": index["_class_name"]}
    if not config_file.is_file():
        raise ConfigError(f"{path} is not a checkpoint directory: {config_file.name} is missing")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ConfigError(f"{config_file} has no model_type")
    return config
