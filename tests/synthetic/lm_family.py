"""The synthetic text family (``model_type: synthetic_lm``): a batched "LLM" that echoes, for tests and benchmarks.

Its reply is the last user message (or the prompt) echoed back word by word, one word (with its leading
space) per step, then EOS; ``ignore_eos`` repeats the echo until ``max_tokens``. Every step runs on the
shared batch scheduler, so it exercises the same paths a real text model does (continuous batching,
watermarks, aborts, usage), deterministically: with ``record=True`` the model logs
``("step", prefill_ids, decode_ids)`` and ``("release", seq_id)`` events, and ``step_cost_ms`` emulates device
time by sleeping on the worker thread. Tokens are words: ``count_text_tokens`` counts whitespace-split words.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omni_stream.batch_model import Batch, SeqOutput
from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError
from omni_stream.family import LoadContext, ModelKind, TextInfo
from omni_stream.metrics import EngineMetrics
from omni_stream.pipeline import Stage
from omni_stream.requests import Role, TextRequest
from omni_stream.runtime.step_record import StepRecord
from omni_stream.scheduler import Scheduler
from omni_stream.text.stage import text_generation_stage
from omni_stream.validation.text import fit_prompt, prompt_field
from omni_stream.worker import DeviceWorker
from synthetic.config import check_keys, write_config

MODEL_TYPE = "synthetic_lm"
_WORD = re.compile(r"\s*\S+")


@dataclass(slots=True, frozen=True)
class SyntheticLMConfig:
    """``max_context`` in tokens (words); ``step_cost_ms`` of emulated device time per step."""

    model_type: str = MODEL_TYPE
    model_name: str = "synthetic-lm"
    max_context: int = 4096
    step_cost_ms: float = 0.0
    reply_prefix: str = ""  # words put before the echo (e.g. "You said:")

    def __post_init__(self) -> None:
        if self.model_type != MODEL_TYPE:
            raise ConfigError(f"model_type must be {MODEL_TYPE!r}, got {self.model_type!r}")
        if self.max_context < 2:
            raise ConfigError("max_context must be >= 2")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SyntheticLMConfig:
        check_keys(cls, data, MODEL_TYPE)
        return cls(**data)


def write_lm_checkpoint(path: str | Path, **options: Any) -> Path:
    """Write a synthetic text checkpoint (``config.json``) into ``path``."""
    return write_config(path, asdict(SyntheticLMConfig.from_dict(options)))


def words(text: str) -> list[str]:
    """The tokens of ``text``: each word with the whitespace before it."""
    return _WORD.findall(text)


@dataclass(slots=True, frozen=True)
class LMInput:
    """One sequence: the reply's tokens, the token budget, and whether EOS is ignored."""

    reply: tuple[str, ...]
    max_tokens: int
    ignore_eos: bool = False


class SyntheticLM(StepRecord):
    """A BatchModel: each step emits the next reply word of every sequence (see module docstring)."""

    def __init__(self, config: SyntheticLMConfig, max_batch_size: int = 32, *, record: bool = False) -> None:
        self.config = config
        self._max_batch_size = max_batch_size
        super().__init__(record=record)
        self.step_cost_s = config.step_cost_ms / 1000.0

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    def step(self, batch: Batch) -> list[SeqOutput]:
        self.record_step(batch)
        for seq in batch.prefill:
            seq.model_state = 0  # tokens emitted
            self.live.add(seq.seq_id)
        if self.step_cost_s > 0:
            time.sleep(self.step_cost_s)
        outputs = []
        for seq in (*batch.prefill, *batch.decode):
            payload: LMInput = seq.payload
            k = seq.model_state
            seq.model_state = k + 1
            if k >= len(payload.reply) and not payload.ignore_eos:
                outputs.append(SeqOutput(seq.seq_id, TextDelta("", k, final=True, finish_reason="stop"), True))
                continue
            final = k + 1 >= payload.max_tokens
            word = payload.reply[k % len(payload.reply)]
            delta = TextDelta(word, k, final=final, finish_reason="length" if final else None)
            outputs.append(SeqOutput(seq.seq_id, delta, final))
        return outputs


class SyntheticLMFamily:
    """A loaded synthetic text checkpoint; ``model`` and ``scheduler`` are public for tests."""

    def __init__(
        self,
        config: SyntheticLMConfig,
        worker: DeviceWorker,
        *,
        max_batch_size: int = 32,
        max_buffered_tokens: int = 32,
        metrics: EngineMetrics | None = None,
        record: bool = False,
    ) -> None:
        self.config = config
        self.model = SyntheticLM(config, max_batch_size, record=record)
        self.scheduler = Scheduler(
            self.model,
            worker,
            high_watermark=max_buffered_tokens,
            metrics=metrics.scheduler("lm") if metrics is not None else None,
            name="lm",
        )
        self.info = TextInfo(config.model_name, config.model_type, ModelKind.TEXT, max_context=config.max_context)

    def count_text_tokens(self, text: str) -> int:
        return len(words(text))

    def _prompt(self, request: TextRequest) -> tuple[int, str]:
        """(prompt tokens, the text to echo)."""
        if request.prompt is not None:
            return self.count_text_tokens(request.prompt), request.prompt
        n = sum(self.count_text_tokens(m.content) + 2 for m in request.messages)  # role and end markers
        users = [m.content for m in request.messages if m.role is Role.USER]
        return n, users[-1] if users else request.messages[-1].content

    def text_stage(self, request: TextRequest, ctx: RequestContext) -> Stage[Any, TextDelta]:
        n_prompt, echo = self._prompt(request)
        max_tokens = fit_prompt(n_prompt, request.max_tokens, self.config.max_context, prompt_field(request))
        reply = tuple(words(f"{self.config.reply_prefix} {echo}".strip())) or ("...",)
        payload = LMInput(reply, max_tokens, request.ignore_eos)

        async def prepare(ctx: RequestContext) -> LMInput:
            ctx.tokens(ModelKind.TEXT).input_tokens = n_prompt
            return payload

        return text_generation_stage(self.scheduler, prepare)

    async def aclose(self) -> None:
        """Nothing to free beyond the scheduler, which the engine's worker shuts down."""


def load_family(load: LoadContext) -> SyntheticLMFamily:
    """Family loader for ``model_type: synthetic_lm`` (runs off the event loop)."""
    return SyntheticLMFamily(
        SyntheticLMConfig.from_dict(load.config),
        load.worker,
        max_batch_size=load.options.max_batch_size,
        max_buffered_tokens=load.options.max_buffered_frames,
        metrics=load.metrics,
    )
