"""A family and a kind defined in a test folder alone (``tests/counter_plugin``), found by declaration or through a
package's entry points, served through ``engine.generate()``, the server in process and ``omni-stream serve``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from counter_plugin.declaration import FAMILIES
from counter_plugin.family import write_checkpoint
from counter_plugin.kind import COUNTER, KIND, CountRequest
from serving_helpers import running_server
from test_serving_cli import free_port, wait_healthy

from omni_stream import family_registry, kinds
from omni_stream.cli import main
from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import ConfigError, InvalidRequestError
from omni_stream.family import FamilyDeclaration, ModelKind
from omni_stream.family_registry import declare_family, family_label, known_families, register_family
from omni_stream.kinds import register_kind
from omni_stream.realtime.settings import Settings
from omni_stream.requests import ChatMessage, ChatRequest, Role, TextRequest
from omni_stream.runtime.settings import Tuning

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def fresh_registries(monkeypatch):
    """Each test registers into registries of its own (found again from the package's folders)."""
    monkeypatch.setattr(family_registry, "_REGISTRY", family_registry._Registry())
    monkeypatch.setattr(kinds, "_REGISTRY", kinds._Registry())


@pytest.fixture
def plugin():
    """The folder's declarations and kind, registered as code would."""
    for declaration in FAMILIES:
        declare_family(declaration)
    register_kind(KIND)


def plugin_site(root: Path) -> Path:
    """A site folder whose dist-info names the plugin's declarations and kind in omni-stream's entry-point groups."""
    dist = root / "counter_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: counter-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[omni_stream.families]\ncounter = counter_plugin.declaration:FAMILIES\n\n"
        "[omni_stream.kinds]\ncounter = counter_plugin.kind:KIND\n"
    )
    return root


def chat(text: str) -> ChatRequest:
    return ChatRequest(TextRequest(messages=(ChatMessage(Role.USER, text),)))


async def test_a_kind_and_its_family_serve_generate_from_their_embedded_default(plugin, tmp_path):
    """No checkpoint given: the kind's embedded default (declared by its family) is built, loaded and stepped."""
    tuning = Tuning.from_env(cache_dir=tmp_path)
    async with await AsyncEngine.load({"c": ModelSource(kind=COUNTER)}, progress=False, tuning=tuning) as engine:
        family = engine.models.get(COUNTER)
        async with engine.generate(CountRequest(3)) as stream:
            outs = [out async for out in stream]
        assert [o.chunk.text for o in outs] == ["1", "2", "3"] and [o.last for o in outs] == [False, False, True]
        assert stream.usage[COUNTER].output_tokens == 3
        assert family.model.steps == 3  # one scheduler step per number
        with pytest.raises(InvalidRequestError, match="no text model loaded"):
            engine.generate(chat("a b"))
    assert (tmp_path / "checkpoints" / "counter-v1" / "config.json").is_file()
    assert family_label("counter") == "Counter" and "counter" in known_families()


async def test_a_family_of_an_existing_kind_serves_beside_the_new_kind(plugin, tmp_path):
    sources = {
        "c": ModelSource(write_checkpoint(tmp_path / "c", "counter", start=7)),
        "lm": ModelSource(write_checkpoint(tmp_path / "rev", "reverse_lm"), kind=ModelKind.TEXT),
    }
    async with await AsyncEngine.load(sources, progress=False) as engine:
        async with engine.generate(chat("one two three")) as stream:
            assert "".join([out.chunk.text async for out in stream]) == "three two one"
        assert stream.usage["text"].output_tokens == 3
        async with engine.generate(CountRequest(2)) as stream:
            assert [out.chunk.text async for out in stream] == ["7", "8"]


def test_make_checkpoint_writes_the_kinds_the_folder_declares(plugin, tmp_path, capsys):
    out = tmp_path / "counter"
    assert main(["make-checkpoint", "--tiny", "--kind", "counter", "--seed", "5", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert (out / "config.json").read_text() == '{"model_type": "counter", "start": 5}'


def test_the_server_serves_the_folders_families(plugin, tmp_path):
    async def load() -> AsyncEngine:
        sources = {
            "c": ModelSource(write_checkpoint(tmp_path / "c", "counter")),
            "lm": ModelSource(write_checkpoint(tmp_path / "rev", "reverse_lm"), kind=ModelKind.TEXT),
        }
        return await AsyncEngine.load(sources, progress=False)

    with running_server(None, Settings(vad_factory=None), load=load) as live:
        client = openai.OpenAI(api_key="none", base_url=f"{live.url}/v1", max_retries=0)
        reply = client.chat.completions.create(model="reverser", messages=[{"role": "user", "content": "a b c d"}])
        assert reply.choices[0].message.content == "d c b a"
        streamed = client.chat.completions.create(
            model="reverser", messages=[{"role": "user", "content": "x y"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in streamed) == "y x"
        models = httpx.get(f"{live.url}/v1/models").json()["data"]
        assert {(m["model_type"], m["kind"]) for m in models} == {("counter", COUNTER), ("reverse_lm", "text")}


async def test_a_package_adds_its_families_and_kinds_through_entry_points(tmp_path, monkeypatch):
    """Nothing registered by code: the dist-info's entry points name the folder's declarations and kind."""
    monkeypatch.syspath_prepend(str(plugin_site(tmp_path / "site")))
    assert "counter" in known_families() and family_label("reverse_lm") == "Reverser"
    async with await AsyncEngine.load({"c": ModelSource(write_checkpoint(tmp_path / "c", "counter"))}) as engine:
        async with engine.generate(CountRequest(2)) as stream:
            assert [out.chunk.text async for out in stream] == ["1", "2"]


def test_omni_stream_serve_loads_a_plugin_package_found_by_its_entry_points(tmp_path):
    """``omni-stream serve`` in a process of its own, the plugin on its path: the new kind's model and the text
    family load from their checkpoints, /v1/models lists both, the chat route answers with the plugin's family."""
    site = plugin_site(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("OMNI_STREAM_API_KEY", None)
    port = free_port()
    counter = write_checkpoint(tmp_path / "c", "counter")
    rev = write_checkpoint(tmp_path / "rev", "reverse_lm", name="reverser")
    cmd = [sys.executable, "-m", "omni_stream.cli", "serve", "--port", str(port), "--log-level", "warning"]
    cmd += ["--model", str(counter), "--llm", str(rev), "--voices-dir", str(tmp_path / "voices")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert {(m["model_type"], m["kind"]) for m in models} == {("counter", COUNTER), ("reverse_lm", "text")}
        body = {"model": "reverser", "messages": [{"role": "user", "content": "p q r"}]}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()
        assert reply["choices"][0]["message"]["content"] == "r q p"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "loaded c (counter, counter), reverser (text, reverse_lm)" in out


async def test_a_family_that_misses_its_kinds_protocol_is_refused_at_load(plugin, tmp_path):
    path = write_checkpoint(tmp_path / "bad", "not_counter")
    with pytest.raises(ConfigError, match="does not implement CounterFamily"):
        await AsyncEngine.load({"c": ModelSource(path)}, progress=False)


def test_declarations_are_checked() -> None:
    with pytest.raises(ConfigError, match="need a loader"):
        FamilyDeclaration(name="x", label="X", kind="speech", model_types=("x",))
    with pytest.raises(ConfigError, match="needs the kind it serves"):
        FamilyDeclaration(name="x", label="X", embedded_default="m:f")
    declare_family(FamilyDeclaration(name="second", label="2", kind=COUNTER, model_types=("c2",), loader=object,
                                     embedded_default="m:f"))  # fmt: skip
    declare_family(FAMILIES[0])
    with pytest.raises(ConfigError, match=r"several families declare the embedded default counter model"):
        family_registry.embedded_checkpoint(COUNTER)


async def test_a_bare_loader_still_registers_under_a_model_type(tmp_path):
    from counter_plugin.family import Reverser

    register_family("reverse_alias", Reverser)
    sources = {"lm": ModelSource(write_checkpoint(tmp_path / "rev", "reverse_alias"))}
    async with await AsyncEngine.load(sources, progress=False) as engine:
        async with engine.chat(TextRequest(messages=(ChatMessage(Role.USER, "q r"),))) as stream:
            assert "".join([out.chunk.text async for out in stream]) == "r q"
