"""The native text family (``model_type: qwen3`` or ``llama``): a hub-layout causal LM on our batch scheduler.

Loading (off the event loop): config and generation config, the tokenizer with its chat template, the LM
(safetensors, or ``load_format="dummy"`` at real sizes), the runner with its slot KV cache (CUDA graphs captured
here on GPU) and its scheduler. ``LoadOptions.backend_args`` may set ``max_model_len`` (positions per sequence:
prompt + output; default ``min(max_position_embeddings, 4096)``), which sizes the KV cache.

Requests: :meth:`CausalLMFamily.text_stage` checks the fields that need no tokens right away; the stage's prepare
step builds the prompt off the loop (chat template, tokenization), checks it against the context (errors name
``messages``/``prompt`` or ``max_tokens``, before any delta) and counts its tokens. Tokens are detokenized on the
device worker (:mod:`.runner`).

``embedded_default_checkpoint()`` builds the tiny random-weight chat model the server loads when no model is given.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import LoadContext, ModelKind, TextInfo
from omni_stream.models.causal_lm.config import load_config, load_generation_defaults
from omni_stream.models.causal_lm.constraint import Grammars
from omni_stream.models.causal_lm.model import load_lm
from omni_stream.models.causal_lm.runner import CausalLMRunner, LMRequest, Prompt
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.pipeline import Stage
from omni_stream.requests import ChatMessage, Role, TextRequest
from omni_stream.runtime.cache import EMBEDDED_MARKER, embedded_checkpoint_dir
from omni_stream.runtime.decoder_kernels import default_kernels
from omni_stream.runtime.offload import run_prepare
from omni_stream.runtime.weights import parse_dtype
from omni_stream.scheduler import Scheduler
from omni_stream.text.grammar import request_grammar
from omni_stream.text.stage import text_generation_stage, with_tool_calls
from omni_stream.text.tool_parsers import ToolFormat
from omni_stream.text.tools import FunctionTool
from omni_stream.validation.text import fit_prompt, prompt_field

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 4096
BACKEND_ARGS = ("max_model_len",)
# How each architecture's chat template asks for tool calls (:mod:`omni_stream.text.tool_parsers`).
TOOL_FORMATS = {"qwen3": ToolFormat.HERMES, "llama": ToolFormat.LLAMA_JSON}
# v2: chat templates with tools, tool-call tag tokens; v3: 4096 positions. Its tokenizer's vocabulary is tiny (a
# few hundred tokens), so a random Whisper's bounded transcript (128 of Whisper's tokens) takes ~700 of its tokens:
# with 1024 positions a voice turn beside a tool's schema did not fit, and every such response failed.
EMBEDDED_NAME = "qwen3-tiny-chat-v3"
EMBEDDED_POSITIONS = 4096


@dataclass(slots=True, frozen=True)
class _Args:
    max_model_len: int | None = None


def _backend_args(items: tuple[tuple[str, object], ...]) -> _Args:
    args = dict(items)
    unknown = sorted(set(args) - set(BACKEND_ARGS))
    if unknown:
        raise ConfigError(f"backend_args: the native text backend takes {', '.join(BACKEND_ARGS)}, not {unknown}")
    n = args.get("max_model_len")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
        raise ConfigError(f"backend_args max_model_len: must be an integer >= 2, got {n!r}")
    return _Args(n)


def _max_len(args: _Args, positions: int) -> int:
    """Positions per sequence: ``max_model_len`` where given (at most the model's ``positions``), else
    ``min(positions, DEFAULT_MAX_MODEL_LEN)``."""
    max_len = args.max_model_len or min(positions, DEFAULT_MAX_MODEL_LEN)
    if max_len > positions:
        raise ConfigError(f"backend_args max_model_len: {max_len} exceeds the model's {positions} positions")
    return max_len


class CausalLMFamily:
    """A loaded causal LM. ``runner``, ``scheduler`` and ``tokenizer`` are public for tests and benchmarks."""

    def __init__(self, load: LoadContext) -> None:
        opts = load.options
        ckpt = load.checkpoint
        if opts.load_format not in ("auto", "safetensors", "dummy"):
            raise ConfigError(f"load_format: must be auto, safetensors or dummy, got {opts.load_format!r}")
        args = _backend_args(opts.backend_args)
        dtype = parse_dtype(opts.dtype, opts.device)
        self.embedded = (ckpt / EMBEDDED_MARKER).exists()
        with opts.progress_bar(total=3, desc=f"loading {ckpt.name}", unit="part") as bar:
            self.config = cfg = load_config(ckpt)
            self.defaults = load_generation_defaults(ckpt, cfg)
            self.tokenizer = ChatTokenizer(ckpt)
            bar.update(1)
            lm = load_lm(ckpt, device=opts.device, dtype=dtype, load_format=opts.load_format, config=cfg)
            bar.update(1)
            max_len = _max_len(args, cfg.max_position_embeddings)
            self.runner = CausalLMRunner(
                lm,
                self.tokenizer.decode,
                eos_token_ids=self.defaults.eos_token_ids,
                max_batch_size=opts.max_batch_size,
                max_len=max_len,
                fused=default_kernels(torch.device(opts.device), opts.tuning) or False,
                group_prefill=opts.tuning.group_prefill_graphs,
                token_bytes=self.tokenizer.token_bytes,
            )
            # On CUDA the decode step replays per-bucket graphs; capturing them here keeps it out of requests.
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
        self.tag_tokens = self.tokenizer.is_token("<tool_call>")  # Qwen3's call tags are tokens of their own
        self._tool_tokens: dict[tuple[FunctionTool, ...], int] = {}
        self.max_context = self.runner.max_len
        self.info = TextInfo(ckpt.name, cfg.model_type, ModelKind.TEXT, max_context=self.max_context)
        if self.embedded:
            log.warning(
                "serving the embedded tiny text checkpoint %s: random weights, it babbles "
                "(load a real Qwen3 or Llama checkpoint as the text model for real replies)",
                ckpt,
            )

    # --- requests -------------------------------------------------------------------------------------------

    def count_tool_tokens(self, tools: tuple[FunctionTool, ...]) -> int:
        """Prompt tokens the chat template spends on offering ``tools`` (blocking: call it off the loop)."""
        if tools not in self._tool_tokens:
            probe = TextRequest(messages=(ChatMessage(Role.USER, "x"),))
            with_tools = self.tokenizer.encode(dataclasses.replace(probe, tools=tools))
            self._tool_tokens[tools] = max(0, len(with_tools) - len(self.tokenizer.encode(probe)))
        return self._tool_tokens[tools]

    def count_text_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the checkpoint's tokenizer (blocking: call it off the loop for long text)."""
        return self.tokenizer.count(text)

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (its chat template's format)."""
        return TOOL_FORMATS[self.config.model_type]

    def runner_prompt(self, request: TextRequest) -> Prompt:
        """``request``'s prompt as the runner reads it (blocking: tokenization; run on a preparation thread)."""
        return Prompt(tuple(self.tokenizer.encode(request)))

    def runner_request(self, prompt: Prompt, request: LMRequest) -> LMRequest:
        """The runner's payload: ``request`` (the prompt's ids and every field of the text request) as it is; a
        family whose prompts carry more (images) extends it."""
        return request

    def text_stage(self, request: TextRequest, ctx: RequestContext) -> Stage[object, TextDelta]:
        """The stage of ``request`` (a chat without a template is refused now; the prompt is fitted to the context
        in the stage, before any delta)."""
        if request.messages and not self.tokenizer.has_chat_template:
            raise InvalidRequestError("this model has no chat template: send a raw prompt instead", "messages")
        sampling = request.sampling or self.sampling
        bad = [t for t, _ in request.logit_bias if t >= self.config.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"logit_bias names token {bad[0]}, outside the vocabulary of {self.config.vocab_size}", "logit_bias"
            )
        tool_format = self.tool_format
        grammar = request_grammar(
            request.offered_tools,
            request.tool_choice,
            request.response_format,
            tool_format,
            request.parallel_tool_calls,
            self.tag_tokens,
        )
        grammar_field = "tools" if request.tool_choice.forces_call else "response_format"

        async def prepare(ctx: RequestContext) -> LMRequest:
            prompt = await run_prepare(self.runner_prompt, request)
            max_tokens = fit_prompt(len(prompt.ids), request.max_tokens, self.max_context, prompt_field(request))
            matcher = None if grammar is None else await run_prepare(self.grammars.matcher, grammar, grammar_field)
            ctx.tokens(ModelKind.TEXT).input_tokens = len(prompt.ids)
            payload = LMRequest(
                prompt.ids,
                max_tokens,
                sampling,
                request.seed,
                request.stop,
                request.ignore_eos,
                matcher=matcher,
                presence_penalty=request.presence_penalty,
                frequency_penalty=request.frequency_penalty,
                logit_bias=request.logit_bias,
                logprobs=request.logprobs,
                grammar_field=grammar_field,
            )
            return self.runner_request(prompt, payload)

        stage = text_generation_stage(self.scheduler, prepare)
        if request.offered_tools:
            stage = with_tool_calls(stage, tool_format, request.parallel_tool_calls)
        return stage

    async def aclose(self) -> None:
        """Nothing to free beyond the scheduler, which the engine's worker shuts down."""


def load_family(load: LoadContext) -> CausalLMFamily:
    """Family loader for ``model_type: qwen3`` and ``llama`` (runs off the event loop)."""
    return CausalLMFamily(load)


def embedded_default_checkpoint(cache_dir: str | Path | None = None) -> Path:
    """The tiny Qwen3 chat checkpoint served when no model is given; built on first use (atomically)."""
    from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint

    def write(out: Path) -> Path:
        return write_tiny_checkpoint(out, "qwen3", seed=0, positions=EMBEDDED_POSITIONS)

    return embedded_checkpoint_dir(EMBEDDED_NAME, write, "random weights: it babbles", cache_dir)
