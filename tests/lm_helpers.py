"""Tiny causal-LM checkpoints (built once per test run), a step-by-step driver of the runner on the real scheduler,
and transformers' greedy output as the text-backend contract's reference.

The driver attaches a :class:`Scheduler` to a worker that is never started and calls ``run_step()`` itself, so a
test decides exactly at which step each request joins; admission, slots and releases are the scheduler's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
import torch
from text_backend_contract import Reference

from omni_stream.chunks import TextDelta
from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint
from omni_stream.models.causal_lm.config import load_config, load_generation_defaults
from omni_stream.models.causal_lm.model import load_lm
from omni_stream.models.causal_lm.runner import CausalLMRunner, LMRequest
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.requests import ChatMessage, Role, SamplingParams, TextRequest
from omni_stream.scheduler import Scheduler
from omni_stream.worker import DeviceWorker

_BUILT: dict[str, Path] = {}


def tiny_lm_checkpoint(tmp_path_factory: pytest.TempPathFactory, arch: str = "qwen3") -> Path:
    """The tiny random ``arch`` chat checkpoint of this test run (written once)."""
    if arch not in _BUILT:
        _BUILT[arch] = write_tiny_checkpoint(tmp_path_factory.mktemp(f"lm-{arch}"), arch, seed=0)
    return _BUILT[arch]


@dataclass(slots=True)
class TinyLM:
    """A loaded tiny checkpoint: its directory, tokenizer and a runner factory."""

    path: Path
    tokenizer: ChatTokenizer
    eos: tuple[int, ...]

    def runner(self, slots: int = 4, max_len: int = 256, *, group_prefill: bool = False) -> CausalLMRunner:
        lm = load_lm(self.path, dtype=torch.float32)
        return CausalLMRunner(
            lm,
            self.tokenizer.decode,
            eos_token_ids=self.eos,
            max_batch_size=slots,
            max_len=max_len,
            group_prefill=group_prefill,
            record=True,
        )

    def request(
        self, text: str, *, max_tokens: int = 16, sampling: SamplingParams, seed: int | None = None, **kw
    ) -> LMRequest:
        ids = self.tokenizer.encode(TextRequest(messages=(ChatMessage(Role.USER, text),)))
        return LMRequest(tuple(ids), max_tokens, sampling, seed, **kw)


def load_tiny(path: Path) -> TinyLM:
    cfg = load_config(path)
    return TinyLM(path, ChatTokenizer(path), load_generation_defaults(path, cfg).eos_token_ids)


@dataclass(slots=True)
class Run:
    """What one request got: its deltas, sampled ids, error, and the steps it was in."""

    deltas: list[TextDelta] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)

    @property
    def finish_reason(self) -> str | None:
        return self.deltas[-1].finish_reason if self.deltas and self.deltas[-1].final else None


async def drive(
    runner: CausalLMRunner, requests: Sequence[LMRequest], join_steps: Sequence[int] | None = None
) -> list[Run]:
    """Run ``requests`` through a scheduler over ``runner``; request ``i`` is queued before step ``join_steps[i]``."""
    join = list(join_steps) if join_steps is not None else [0] * len(requests)
    sched = Scheduler(runner, DeviceWorker(), high_watermark=10_000, name="test")
    runs = [Run() for _ in requests]
    sessions: dict[int, object] = {}
    runner.recorded.clear()
    step = 0
    try:
        while len(sessions) < len(requests) or not all(s.done for s in sessions.values()):  # type: ignore[attr-defined]
            for i in range(len(requests)):
                if i not in sessions and join[i] <= step:
                    sessions[i] = sched.open(requests[i])
            if sched.has_work():
                sched.run_step()
            step += 1
            assert step < 10_000, "the driver did not finish"
        sched.run_step()  # releases the last finished sequences
        for i, sess in sessions.items():
            runs[i].deltas = list(sess.buffer)  # type: ignore[attr-defined]
            runs[i].error = sess.error  # type: ignore[attr-defined]
            runs[i].tokens = list(runner.recorded.get(sess.seq.seq_id, ()))  # type: ignore[attr-defined]
    finally:
        for sess in sessions.values():
            sched.release(sess)  # type: ignore[arg-type]
    assert all(v == 0 for v in sched.live().values()), sched.live()
    return runs


def transformers_reference(checkpoint: Path) -> Callable[[TextRequest], Awaitable[Reference]]:
    """The contract's reference for greedy chat requests on ``checkpoint``: transformers' chat template and
    ``generate()``, decoded by its tokenizer (nothing of omni-stream's, nor of the backend under test)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")

    def generate(request: TextRequest) -> Reference:
        assert request.sampling is not None and not request.sampling.do_sample and request.ignore_eos
        messages = [{"role": m.role.value, "content": m.content} for m in request.messages]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        prompt = torch.tensor([ids])
        with torch.no_grad():  # an explicit mask: generate() would take every id equal to pad_token_id for padding
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=request.max_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
        new = out[0, len(ids) :].tolist()
        return Reference(tokenizer.decode(new, skip_special_tokens=True), len(ids), len(new))

    async def reference(request: TextRequest) -> Reference:
        return await anyio.to_thread.run_sync(generate, request)

    return reference
