"""Two families batched on the engine's scheduler: a counter (the ``counter`` kind) and a word reverser (text)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from counter_plugin.kind import COUNTER, CountRequest
from omni_stream.batch_model import Batch, SeqOutput, Sequence
from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.family import LoadContext, ModelInfo, ModelKind, TextInfo
from omni_stream.requests import Role, TextRequest
from omni_stream.runtime.cache import embedded_checkpoint_dir
from omni_stream.scheduler import Scheduler
from omni_stream.text.stage import text_generation_stage


class WordSteps:
    """A BatchModel: each step emits the next word of every sequence's payload (a tuple of words)."""

    max_batch_size = 4

    def __init__(self) -> None:
        self.steps = 0  # model steps run (each may serve several sequences)

    def step(self, batch: Batch) -> list[SeqOutput]:
        self.steps += 1
        out = []
        for seq in (*batch.prefill, *batch.decode):
            seq.model_state = k = (seq.model_state or 0) + 1
            words: tuple[str, ...] = seq.payload
            last = k >= len(words)
            out.append(SeqOutput(seq.seq_id, TextDelta(words[k - 1], k - 1, last, "stop" if last else None), last))
        return out

    def release(self, seq: Sequence) -> None:
        seq.model_state = None


class Counter:
    """The ``counter`` family: ``start`` from its config.json is the first number it says (default 1)."""

    def __init__(self, load: LoadContext) -> None:
        self.start = int(load.config.get("start", 1))
        self.info = ModelInfo(load.checkpoint.name, "counter", COUNTER)
        self.model = WordSteps()
        self.scheduler = Scheduler(self.model, load.worker, name=COUNTER)

    def count_stage(self, request: CountRequest, ctx: RequestContext) -> Any:
        words = tuple(str(self.start + i) for i in range(request.n))

        async def prepare(ctx: RequestContext) -> tuple[str, ...]:
            return words

        return text_generation_stage(self.scheduler, prepare, name="count", kind=COUNTER)

    async def aclose(self) -> None:
        pass


class Reverser:
    """A text family: replies with the user's last message, word by word in reverse order."""

    def __init__(self, load: LoadContext) -> None:
        self.info = TextInfo(load.config.get("name", "reverser"), "reverse_lm", ModelKind.TEXT, max_context=64)
        self.scheduler = Scheduler(WordSteps(), load.worker, name="reverse")

    def count_text_tokens(self, text: str) -> int:
        return len(text.split())

    def text_stage(self, request: TextRequest, ctx: RequestContext) -> Any:
        users = [m.content for m in request.messages if m.role is Role.USER]
        words = [f" {w}" for w in reversed(users[-1].split())]
        words[0] = words[0].strip()

        async def prepare(ctx: RequestContext) -> tuple[str, ...]:
            ctx.tokens(ModelKind.TEXT).input_tokens = len(users[-1].split())
            return tuple(words)

        return text_generation_stage(self.scheduler, prepare)

    async def aclose(self) -> None:
        pass


class NotACounter:
    """Says it is a counter, but has no ``count_stage``: refused when it loads."""

    def __init__(self, load: LoadContext) -> None:
        self.info = ModelInfo("nope", "not_counter", COUNTER)

    async def aclose(self) -> None:
        pass


def write_checkpoint(path: Path, model_type: str, **config: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, **config}))
    return path


def make(args: argparse.Namespace) -> Path:
    """``omni-stream make-checkpoint --kind counter|reverse-lm`` (``--seed``: the counter's first number)."""
    if args.kind == "counter":
        return write_checkpoint(Path(args.out), "counter", start=args.seed or 1)
    return write_checkpoint(Path(args.out), "reverse_lm", name="reverser")


def embedded_default(cache_dir: Path | None = None) -> Path:
    """The counter the ``counter`` kind serves when no model is given."""
    return embedded_checkpoint_dir(
        "counter-v1", lambda out: write_checkpoint(out, "counter", start=1), "counts from 1", cache_dir
    )
