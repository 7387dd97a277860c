"""The Qwen2.5-VL text family (``model_type: qwen2_5_vl``): a text model that sees images, on our batch scheduler.

Loading (off the event loop) follows the causal LM's (:mod:`omni_stream.models.causal_lm.family`): configs, the
tokenizer with its chat template, the model (safetensors, or ``load_format="dummy"`` at real sizes), the runner
with its slot KV cache and its scheduler; ``preprocessor_config.json`` gives the image policy.
``LoadOptions.backend_args`` may set ``max_model_len`` (default ``min(max_position_embeddings, 4096)``).

Requests are the causal LM's (:class:`~omni_stream.requests.TextRequest`: tools, grammars, sampling, stops), and
user turns may show images (``ChatMessage.images``: uint8 RGB arrays). The stage's prepare step runs on the loop's
preparation threads: the chat template and tokenization, each image resized, normalized and cut into patches, its
``<|image_pad|>`` token repeated once per merged patch, the prompt's multimodal positions; then the prompt, images
included, is fitted to the context (errors name ``messages`` or ``max_tokens``, before any delta). The vision tower
runs on the device worker, in the prefill of the step that admits the request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import numpy as np

from omni_stream.errors import ConfigError
from omni_stream.family import LoadContext, ModelKind, TextInfo
from omni_stream.models.causal_lm.config import load_generation_defaults
from omni_stream.models.causal_lm.constraint import Grammars
from omni_stream.models.causal_lm.family import CausalLMFamily, _backend_args, _max_len
from omni_stream.models.causal_lm.runner import LMRequest, Prompt
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.models.qwen_vl.config import load_config, load_image_spec
from omni_stream.models.qwen_vl.model import load_vl
from omni_stream.models.qwen_vl.prompt import VLPrompt, encode_prompt, session_prefix
from omni_stream.models.qwen_vl.runner import QwenVLRunner, VLRequest
from omni_stream.models.qwen_vl.session import FrameSession
from omni_stream.models.qwen_vl.vision import image_prompt_tokens, smart_resize
from omni_stream.requests import TextRequest
from omni_stream.runtime.weights import parse_dtype
from omni_stream.scheduler import Scheduler
from omni_stream.text.tool_parsers import ToolFormat

log = logging.getLogger(__name__)

TOOL_FORMAT = ToolFormat.HERMES  # Qwen2.5's tool calls: <tool_call>{"name", "arguments"}</tool_call>
DEFAULT_MAX_SESSIONS = 2


@dataclass(slots=True, frozen=True)
class _SessionArgs:
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_rows: int | None = None


def _session_args(items: tuple[tuple[str, object], ...]) -> tuple[_SessionArgs, tuple[tuple[str, object], ...]]:
    """``max_sessions`` (frame sessions held at once, default 2) and ``session_rows`` (cache rows of each, default
    half of ``max_model_len``) out of ``backend_args``; the rest is the causal LM's."""
    values = dict(items)
    for key, least in (("max_sessions", 0), ("session_rows", 1)):
        n = values.get(key)
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < least):
            raise ConfigError(f"backend_args {key}: must be an integer >= {least}, got {n!r}")
    max_sessions = values.pop("max_sessions", DEFAULT_MAX_SESSIONS)
    rows = values.pop("session_rows", None)
    assert isinstance(max_sessions, int) and (rows is None or isinstance(rows, int))
    return _SessionArgs(max_sessions, rows), tuple(values.items())


class QwenVLFamily(CausalLMFamily):
    """A loaded Qwen2.5-VL. ``runner``, ``scheduler`` and ``tokenizer`` are public for tests and benchmarks."""

    runner: QwenVLRunner

    def __init__(self, load: LoadContext) -> None:  # the causal LM's loading, with this family's parts
        opts = load.options
        ckpt = load.checkpoint
        if opts.load_format not in ("auto", "safetensors", "dummy"):
            raise ConfigError(f"load_format: must be auto, safetensors or dummy, got {opts.load_format!r}")
        sessions, rest = _session_args(opts.backend_args)
        args = _backend_args(rest)
        dtype = parse_dtype(opts.dtype, opts.device)
        self.embedded = False
        self.worker = load.worker
        with opts.progress_bar(total=3, desc=f"loading {ckpt.name}", unit="part") as bar:
            self.vl_config = vl = load_config(ckpt)
            self.config = cfg = vl.text
            self.image_spec = load_image_spec(ckpt, vl.vision)
            self.defaults = load_generation_defaults(ckpt, cfg)
            self.tokenizer = ChatTokenizer(ckpt)
            bar.update(1)
            model = load_vl(ckpt, device=opts.device, dtype=dtype, load_format=opts.load_format, config=vl)
            bar.update(1)
            max_len = _max_len(args, cfg.max_position_embeddings)
            self.runner = QwenVLRunner(
                model,
                self.tokenizer.decode,
                eos_token_ids=self.defaults.eos_token_ids,
                max_batch_size=opts.max_batch_size,
                max_len=max_len,
                max_sessions=sessions.max_sessions,
                session_rows=sessions.session_rows,
            )
            self.capture_seconds = self.runner.capture_graphs(progress=opts.progress_bar)
            self.scheduler = Scheduler(
                self.runner,
                load.worker,
                high_watermark=opts.max_buffered_frames,
                metrics=load.metrics.scheduler("text"),
                name="text",
            )
            bar.update(1)
        self.sampling = self.defaults.sampling
        self.grammars = Grammars(self.tokenizer.hf, cfg.vocab_size, self.defaults.eos_token_ids)
        self.tag_tokens = self.tokenizer.is_token("<tool_call>")
        self._tool_tokens = {}
        self.max_context = self.runner.max_len
        self.info = TextInfo(ckpt.name, vl.text.model_type, ModelKind.TEXT, max_context=self.max_context,
                             sees_images=True)  # fmt: skip

    def count_image_tokens(self, image: np.ndarray) -> int:
        """Prompt tokens ``image`` (uint8 RGB ``(h, w, 3)``) takes: its pads, one per merged patch, and the vision
        start and end markers around them (for fitting a conversation to the context before it is encoded)."""
        spec = self.image_spec
        h, w = smart_resize(image.shape[0], image.shape[1], spec.factor, spec.min_pixels, spec.max_pixels)
        return image_prompt_tokens((h // spec.patch_size) * (w // spec.patch_size) // spec.merge_size**2)

    def encode_prompt(self, request: TextRequest) -> VLPrompt:
        """The runner's prompt of ``request``, continuing a frame session's rows where its images are that
        session's frames (blocking: call it off the loop)."""
        views = tuple(self.runner.views.values())
        return encode_prompt(self.tokenizer, self.vl_config, self.image_spec, request, views)

    def frame_session(self, *, max_frames: int = 8, system: str | None = None) -> FrameSession:
        """A session whose frames are prefilled into a held cache as they arrive (``async with``; see
        :class:`~.session.FrameSession`). ``max_frames``: the window (oldest out); ``system``: the system turn its
        queries start with (None: none)."""
        return FrameSession(self, max_frames=max_frames, system=system)

    def session_prefix(self, system: str | None) -> tuple[int, ...]:
        """Ids of a session's prompt up to its user turn's first frame (blocking: the chat template)."""
        return session_prefix(self.tokenizer, self.vl_config, system)

    @property
    def tool_format(self) -> ToolFormat:
        return TOOL_FORMAT

    def runner_prompt(self, request: TextRequest) -> VLPrompt:
        return self.encode_prompt(request)

    def runner_request(self, prompt: Prompt, request: LMRequest) -> VLRequest:
        """``request`` with the prompt's images, positions and the session rows it continues."""
        assert isinstance(prompt, VLPrompt)
        common = {f.name: getattr(request, f.name) for f in fields(LMRequest)}
        return VLRequest(**common, images=prompt.images, positions=prompt.positions, rope_delta=prompt.rope_delta,
                         cached=prompt.cached)  # fmt: skip


def load_family(load: LoadContext) -> QwenVLFamily:
    """Family loader for ``model_type: qwen2_5_vl`` (runs off the event loop)."""
    return QwenVLFamily(load)
