"""Model families from outside the package: defined here alone, registered, served by the engine and the server."""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import openai
import pytest
from serving_helpers import running_server

from omni_stream import family as family_module
from omni_stream.batch_model import Batch, SeqOutput, Sequence
from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import ConfigError
from omni_stream.family import LoadContext, ModelInfo, ModelKind, TextInfo, register_family, register_kind
from omni_stream.pipeline_specs import ModelSet, PipelineSpec, Plan, StagePlan, register_pipeline
from omni_stream.realtime.settings import Settings
from omni_stream.requests import ChatMessage, ChatRequest, Role, TextRequest, next_request_id
from omni_stream.scheduler import Scheduler
from omni_stream.text.stage import text_generation_stage

# --- a text family: replies with the user's words in reverse order, one word a step -----------------------


class Reverser:
    """A BatchModel: each step emits the next word of every sequence's reversed prompt."""

    max_batch_size = 4

    def step(self, batch: Batch) -> list[SeqOutput]:
        out = []
        for seq in (*batch.prefill, *batch.decode):
            seq.model_state = k = (seq.model_state or 0) + 1
            words: tuple[str, ...] = seq.payload
            last = k >= len(words)
            out.append(SeqOutput(seq.seq_id, TextDelta(words[k - 1], k, last, "stop" if last else None), last))
        return out

    def release(self, seq: Sequence) -> None:
        seq.model_state = None


class ReverseFamily:
    def __init__(self, load: LoadContext) -> None:
        self.info = TextInfo(load.config.get("name", "reverser"), "reverse_lm", ModelKind.TEXT, max_context=64)
        self.scheduler = Scheduler(Reverser(), load.worker, name="reverse")

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


def reverse_checkpoint(path: Path, model_type: str = "reverse_lm") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "name": "reverser"}))
    return path


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_a_family_defined_in_a_test_file_serves_engine_generate(tmp_path):
    register_family("reverse_lm", ReverseFamily)
    sources = {"lm": ModelSource(reverse_checkpoint(tmp_path / "rev"))}
    async with await AsyncEngine.load(sources, progress=False) as engine:
        request = ChatRequest(TextRequest(messages=(ChatMessage(Role.USER, "one two three"),)))
        async with engine.generate(request) as stream:
            text = "".join([out.chunk.text async for out in stream])
        assert text == "three two one"
        assert stream.usage["text"].output_tokens == 3


def test_a_family_defined_in_a_test_file_serves_the_chat_route(tmp_path):
    register_family("reverse_lm", ReverseFamily)
    with running_server(None, Settings(), llm=reverse_checkpoint(tmp_path / "rev")) as live:
        client = openai.OpenAI(api_key="none", base_url=f"{live.url}/v1", max_retries=0)
        reply = client.chat.completions.create(model="reverser", messages=chat("a b c d"))
        assert reply.choices[0].message.content == "d c b a"
        streamed = client.chat.completions.create(model="reverser", messages=chat("x y"), stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == "y x"


async def test_a_family_from_an_entry_point_loads_without_registration(tmp_path, monkeypatch):
    """A package adds a family through the ``omni_stream.families`` entry-point group (a dist-info on sys.path)."""
    package = tmp_path / "site"
    (package / "rev_plugin.py").parent.mkdir(parents=True)
    (package / "rev_plugin.py").write_text(
        textwrap.dedent(
            """
            from test_family_plugin import ReverseFamily

            def load(load_context):
                return ReverseFamily(load_context)
            """
        )
    )
    dist = package / "rev_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rev-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[omni_stream.families]\nreverse_ep = rev_plugin:load\n")
    monkeypatch.syspath_prepend(str(package))
    monkeypatch.setattr(family_module, "_REGISTRY", family_module._Registry())  # entry points not read yet
    assert "reverse_ep" in family_module.known_families()
    sources = {"lm": ModelSource(reverse_checkpoint(tmp_path / "ep", model_type="reverse_ep"))}
    async with await AsyncEngine.load(sources, progress=False) as engine:
        assert engine.models.text().info.model_type == "reverse_lm"
        async with engine.chat(TextRequest(messages=(ChatMessage(Role.USER, "q r"),))) as stream:
            assert "".join([out.chunk.text async for out in stream]) == "r q"


# --- a new kind: its request type, protocol and pipeline declared here -------------------------------------


@dataclass(slots=True, frozen=True)
class CountRequest:
    """Count from 1 to ``n`` (a toy kind)."""

    n: int
    request_id: str = field(default_factory=next_request_id)


@runtime_checkable
class CounterFamily(Protocol):
    info: ModelInfo

    def count_stage(self, request: CountRequest, ctx: RequestContext) -> Any: ...

    async def aclose(self) -> None: ...


class Counter:
    def __init__(self, load: LoadContext) -> None:
        self.info = ModelInfo("counter", "counter", "counter")

    def count_stage(self, request: CountRequest, ctx: RequestContext) -> Any:
        async def count(ctx: RequestContext, upstream: AsyncIterator[Any]) -> AsyncIterator[TextDelta]:
            for i in range(1, request.n + 1):
                yield TextDelta(str(i), i, final=i == request.n)

        return count

    async def aclose(self) -> None:
        pass


class NotACounter:
    def __init__(self, load: LoadContext) -> None:
        self.info = ModelInfo("nope", "not_counter", "counter")

    async def aclose(self) -> None:
        pass


def build_count(models: ModelSet, request: CountRequest, ctx: RequestContext) -> Plan:
    family = models.get("counter")
    assert isinstance(family, CounterFamily)
    return Plan((StagePlan("count", family.count_stage(request, ctx)),))


async def test_a_new_kind_registers_its_protocol_and_pipeline_from_outside(tmp_path):
    register_kind("counter", CounterFamily)
    register_family("counter", Counter)
    register_pipeline(PipelineSpec("count", CountRequest, ("counter",), build_count))
    path = tmp_path / "counter"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "counter"}))
    async with await AsyncEngine.load({"c": ModelSource(path)}, progress=False) as engine:
        async with engine.generate(CountRequest(3)) as stream:
            outs = [out async for out in stream]
    assert [o.chunk.text for o in outs] == ["1", "2", "3"] and [o.last for o in outs] == [False, False, True]


async def test_a_family_that_misses_its_kinds_protocol_is_refused_at_load(tmp_path):
    register_kind("counter", CounterFamily)
    register_family("not_counter", NotACounter)
    path = tmp_path / "bad"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "not_counter"}))
    with pytest.raises(ConfigError, match="does not implement CounterFamily"):
        await AsyncEngine.load({"c": ModelSource(path)}, progress=False)
