"""The talker's latency levers (fields of the tuning object, omni_stream/runtime/settings.py), each proven on the real
tiny Qwen3-TTS by step logs and event order, with codes and audio equal to the synchronous path:

- admit_after_collect: a request that arrives while the step launched ahead runs is prefilled into the next launch;
- first_window_wait_ms: after a step that completes first audio windows, their codec jobs run before the next step;
- prefill_budget: a long prompt is prefilled in chunks over several steps while the running rows keep stepping;
- voice_cache: reference audio sent again is not extracted again.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import anyio
import numpy as np
import pytest
import torch

from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError
from omni_stream.models.qwen3_tts import codec_stage as codec_mod
from omni_stream.models.qwen3_tts.checkpoint import load_lm, write_tiny_checkpoint
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import GREEDY, SamplingParams, SpeechRequest
from omni_stream.runtime.settings import Tuning
from omni_stream.scheduler import Scheduler
from omni_stream.worker import DeviceWorker

SUB_GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0)
TOL = 1e-4


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("cv"), "custom_voice", "0.6b", seed=1)
    return path, load_config(path), TextTokenizer(path), load_lm(path, dtype=torch.float32)


def make(model, **kw):
    _, cfg, tok, _ = model
    kw = {"sampling": GREEDY, "options": Qwen3TTSOptions(subtalker_sampling=SUB_GREEDY), "language": "English"} | kw
    return prepare_request(SpeechRequest(**kw), cfg, tok)


# --- the switches ---

STEP_AHEAD, WAIT_MS = "OMNI_STREAM_STEP_AHEAD", "OMNI_STREAM_FIRST_WINDOW_WAIT_MS"
BUDGET, CACHE = "OMNI_STREAM_PREFILL_BUDGET", "OMNI_STREAM_VOICE_CACHE"


def test_the_first_audio_levers_are_on_by_default_the_others_off_and_bad_values_are_refused_naming_them():
    env = {"OMNI_STREAM_ADMIT_AFTER_COLLECT": "on", WAIT_MS: "4.5", BUDGET: "128", CACHE: "16"}
    t = Tuning.from_env(env)
    assert (t.admit_after_collect, t.first_window_wait_ms, t.prefill_budget, t.voice_cache) == (True, 4.5, 128, 16)
    d = Tuning()
    assert (d.admit_after_collect, d.first_window_wait_ms, d.prefill_budget, d.voice_cache) == (True, 3.0, 0, 0)
    off = Tuning.from_env({"OMNI_STREAM_ADMIT_AFTER_COLLECT": "off", WAIT_MS: "0"})
    assert (off.admit_after_collect, off.first_window_wait_ms) == (False, 0.0)
    for name, bad in ((WAIT_MS, "51"), (BUDGET, "-3"), (CACHE, "lots"), (BUDGET, "70000")):
        with pytest.raises(ConfigError, match=f"^{name} must be "):
            Tuning.from_env({name: bad})


async def test_each_lever_reaches_the_runner_the_scheduler_or_the_family(cv):
    tuning = Tuning(admit_after_collect=True, first_window_wait_ms=3.0, prefill_budget=64, voice_cache=8)
    async with await AsyncEngine.from_pretrained(cv[0], progress=False, tuning=tuning) as engine:
        fam = engine.models.speech()
        assert fam.scheduler._settle == fam.runner.settle and fam.scheduler.due_wait == 0.003
        assert fam.scheduler._jobs_due == fam.runner.jobs_due and fam.runner.prefill_budget == 64
        assert fam.voice_cache is not None and fam.voice_cache.size == 8
    off = Tuning(admit_after_collect=False, first_window_wait_ms=0.0)
    async with await AsyncEngine.from_pretrained(cv[0], progress=False, tuning=off) as engine:
        fam = engine.models.speech()
        assert fam.scheduler._settle is None and fam.scheduler._jobs_due is None
        assert fam.runner.prefill_budget == 0 and fam.voice_cache is None and not fam.runner.ahead
        # the same fields on the loaded engine, for A/B on one engine: only while the talker is idle
        fam.retune(tuning)
        assert fam.scheduler.settles and fam.scheduler.due_wait == 0.003 and fam.runner.prefill_budget == 64
        assert fam.voice_cache is not None and fam.voice_cache.size == 8 and not fam.runner.ahead
        fam.retune(replace(tuning, step_ahead=True, admit_after_collect=False, voice_cache=0))
        assert fam.runner.ahead and not fam.scheduler.settles and fam.voice_cache is None
        async with engine.speech("Hello world, this is a test.", voice="ryan", max_new_tokens=30) as stream:
            await anext(stream)
            with pytest.raises(RuntimeError, match="idle talker"):
                fam.retune(Tuning())


# --- admit_after_collect ---


def _arrival_during_a_step(model, settle: bool, arrive_in: int) -> tuple[list[list[int]], dict[int, list]]:
    """Request 0 runs alone, stepping ahead; request 1 arrives while the step launched by run_step ``arrive_in - 1``
    is in flight (as the runner waits for it). Returns each run_step's prefilled seq ids and each request's items."""
    a = make(model, text="Hello world, this is a test.", voice="ryan", max_new_tokens=10)
    b = make(model, text="The voice is warm.", voice="sohee", max_new_tokens=7)
    r = Qwen3TTSRunner(model[3], max_batch_size=4, max_len=256, ahead=True)
    sched = Scheduler(r, DeviceWorker(name="levers-test"), high_watermark=1 << 30, settle=settle)
    prefilled: list[list[int]] = []
    sessions = {0: sched.open(a, offline=True)}
    calls = [0]
    collect, step = r._collect, r.step

    def collect_while_a_request_arrives() -> None:
        if r._inflight is not None and calls[0] == arrive_in and 1 not in sessions:
            sessions[1] = sched.open(b, offline=True)  # queued while the device runs the launched step
        collect()

    def logged_step(batch):
        prefilled.append([seq.seq_id for seq in batch.prefill])
        return step(batch)

    r._collect, r.step = collect_while_a_request_arrives, logged_step
    items: dict[int, list] = {0: [], 1: []}
    for calls[0] in range(40):
        with sched.lock:
            runnable = sched.has_work()
        if runnable:
            sched.run_step()
        else:
            prefilled.append([])
        for i, sess in sessions.items():
            items[i] += [(calls[0], item) for item in sess.buffer]
            sess.buffer.clear()
        if all(s.done for s in sessions.values()) and len(sessions) == 2:
            break
    for sess in sessions.values():
        sched.release(sess)
    sched.run_step()
    assert r.num_active == 0
    return prefilled, items


@pytest.mark.parametrize("settle", [False, True], ids=["admitted-before-collect", "admitted-after-collect"])
def test_a_request_arriving_during_the_step_in_flight_joins_the_next_launch_only_when_settled(cv, settle):
    prefilled, items = _arrival_during_a_step(cv, settle, arrive_in=3)
    joined = next(k for k, ids in enumerate(prefilled) if 1 in ids)
    # It arrives during run_step 3's wait for the step in flight. Settled, the wait comes before the batch is
    # picked, so run_step 3 prefills it; otherwise the batch was picked before it arrived: run_step 4 does.
    assert joined == (3 if settle else 4)
    first = items[1][0][0]
    assert first == joined + 1  # stepping ahead: its first frame comes with the call after its launch
    # both requests' codes are the synchronous runner's, solo
    solo = Qwen3TTSRunner(cv[3], max_batch_size=4, max_len=256, ahead=False)
    for i, req in enumerate((
        make(cv, text="Hello world, this is a test.", voice="ryan", max_new_tokens=10),
        make(cv, text="The voice is warm.", voice="sohee", max_new_tokens=7),
    )):  # fmt: skip
        want = solo.generate_codes([req])[0]
        assert torch.equal(torch.cat([item.codes for _, item in items[i]]), want), i


# --- first_window_wait_ms ---


REQUESTS = (
    SpeechRequest("Hello world, this is a test.", voice="ryan", max_new_tokens=14, sampling=GREEDY,
                  options=Qwen3TTSOptions(subtalker_sampling=GREEDY)),
    SpeechRequest("The voice is warm.", voice="sohee", max_new_tokens=10, sampling=GREEDY,
                  options=Qwen3TTSOptions(subtalker_sampling=GREEDY), initial_codec_chunk_frames=2),
)  # fmt: skip


async def _collect(engine, request) -> np.ndarray:
    async with engine.speech(request) as stream:
        return np.concatenate([audio.samples async for audio in stream])


async def _speak_two(engine) -> list[np.ndarray]:
    """REQUESTS together, the second sent once the first has audio (it joins a running batch)."""
    out: list[np.ndarray] = [np.zeros(0), np.zeros(0)]
    first_audio = anyio.Event()

    async def speak(i: int) -> None:
        if i == 1:
            await first_audio.wait()
        async with engine.speech(REQUESTS[i]) as stream:
            parts = []
            async for audio in stream:
                parts.append(audio.samples)
                first_audio.set()
        out[i] = np.concatenate(parts)

    async with anyio.create_task_group() as tg:
        for i in (0, 1):
            tg.start_soon(speak, i)
    return out


@pytest.mark.parametrize("wait", [False, True], ids=["off", "on"])
async def test_first_windows_run_before_the_next_step_when_the_worker_waits_for_them(cv, monkeypatch, wait):
    """Worker events, in order: after each talker call whose frames complete first windows, those windows' codec
    jobs run before the next call (on); off, the worker never waits for them. The audio is each request's own."""
    monkeypatch.setenv(STEP_AHEAD, "on")
    monkeypatch.setenv(WAIT_MS, "50" if wait else "0")
    events: list[tuple[str, int]] = []
    worker_threads: set[str] = set()
    decode = codec_mod.decode_codec_windows

    def logged_decode(decoder, windows):
        events.append(("codec", sum(w.state.state is None for w in windows)))  # a fresh state: a first window
        worker_threads.add(threading.current_thread().name)
        return decode(decoder, windows)

    monkeypatch.setattr(codec_mod, "decode_codec_windows", logged_decode)
    async with await AsyncEngine.from_pretrained(cv[0], progress=False, max_batch_size=4) as engine:
        fam = engine.models.speech()
        assert fam.runner.ahead and fam.scheduler.due_wait == (0.05 if wait else 0)
        # a bound no machine reaches, so the order below never depends on timing (the lever's own is 50 ms)
        fam.scheduler.due_wait = 60.0 if wait else 0.0
        step, waited = fam.runner.step, []
        urgent = engine.worker.wait_for_urgent

        def logged_step(batch):
            out = step(batch)
            events.append(("step", fam.runner.jobs_due()))
            return out

        def logged_wait(count, timeout):
            waited.append((count, got := urgent(count, timeout)))
            return got

        fam.runner.step = logged_step
        engine.worker.wait_for_urgent = logged_wait
        together = await _speak_two(engine)
        fam.runner.step, engine.worker.wait_for_urgent = step, urgent
        alone = [await _collect(engine, r) for r in REQUESTS]
    due_steps = [i for i, (kind, n) in enumerate(events) if kind == "step" and n]
    assert sum(events[i][1] for i in due_steps) == 2  # each request's first window, once
    if wait:
        assert [c for c, _ in waited] == [events[i][1] for i in due_steps]
        assert all(got >= count for count, got in waited)  # every wait ended on its jobs, not on the bound
        for i in due_steps:  # the first windows are the next thing the worker runs
            first_window = next(j for j in range(i + 1, len(events)) if events[j][0] == "codec" and events[j][1])
            next_step = next(j for j in range(i + 1, len(events)) if events[j][0] == "step")
            assert first_window < next_step
    else:
        assert waited == []
    assert worker_threads == {engine.worker.name}
    for have, want in zip(together, alone, strict=True):
        assert have.shape == want.shape and np.abs(have - want).max() < TOL


# --- prefill_budget ---


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("base"), "base", "0.6b", seed=2)
    return path, load_config(path), TextTokenizer(path), load_lm(path, dtype=torch.float32)


@pytest.mark.parametrize("ahead", [False, True], ids=["synchronous", "ahead"])
def test_a_long_prompt_prefills_in_chunks_while_the_running_row_keeps_stepping(base, ahead):
    """An in-context clone's prompt (reference codes and text) over a 6-position budget: the newcomer's prompt goes
    in over several calls, no call prefills more than the budget, the running row gets a frame at every call
    meanwhile, and both rows' codes equal the unbudgeted synchronous runner's."""
    from omni_stream.batch_model import Batch, Sequence
    from omni_stream.requests import VoicePrompt

    cfg = base[1]
    rng = np.random.default_rng(3)
    voice = VoicePrompt(x_vector=rng.standard_normal(cfg.talker.decoder.hidden_size).astype(np.float32),
                        ref_codes=rng.integers(0, 2048, (9, 16)), ref_text="Hello there.")  # fmt: skip
    running = make(base, text="Good.", voice_prompt=voice, x_vector_only_mode=True, max_new_tokens=16)
    clone = make(base, text="This is a test of the voice.", voice_prompt=voice, max_new_tokens=8)
    n = clone.prompt.prefill_len
    assert n > 3 * 6  # several chunks
    plain = Qwen3TTSRunner(base[3], max_batch_size=4, max_len=256, ahead=False)
    want = [plain.generate_codes([q])[0] for q in (running, clone)]

    r = Qwen3TTSRunner(base[3], max_batch_size=4, max_len=256, ahead=ahead, prefill_budget=6)
    a, b = Sequence(seq_id=0, payload=running, slot=0), Sequence(seq_id=1, payload=clone, slot=1)
    items: dict[int, list] = {0: [], 1: []}
    live, k = [a], 0
    while live:
        newcomers = (a,) if k == 0 else (b,) if k == 2 else ()
        decode = tuple(s for s in live if s not in newcomers)
        for out in r.step(Batch(prefill=newcomers, decode=decode)):
            items[out.seq_id].append((k, out.item))
            if out.finished:
                live.remove(next(s for s in live if s.seq_id == out.seq_id))
        if k == 2:
            live.append(b)
        k += 1
    assert max(r.prefill_log) <= 6 and sum(r.prefill_log) == running.prompt.prefill_len + n
    chunk_calls = [i for i, used in enumerate(r.prefill_log) if i >= 2 and used]
    assert len(chunk_calls) == -(-n // 6)  # ceil(n / 6) calls, one after another
    assert chunk_calls == list(range(2, 2 + len(chunk_calls)))
    # the running row's frame at every call while the prompt went in (stepping ahead: from its second call on)
    got_a = {call for call, item in items[0] if item is not None}
    assert set(chunk_calls) <= got_a
    # the clone's first frame only after its last chunk
    first_b = min(call for call, item in items[1] if item is not None)
    assert first_b == chunk_calls[-1] + (1 if ahead else 0)
    for i in (0, 1):
        have = torch.cat([item.codes for _, item in items[i] if item is not None])
        assert torch.equal(have, want[i]), i
    for s in (a, b):
        r.release(s)
    assert r.num_active == 0


def test_a_request_released_mid_prompt_frees_its_slot_for_the_next(base):
    from omni_stream.batch_model import Batch, Sequence
    from omni_stream.requests import VoicePrompt

    cfg = base[1]
    rng = np.random.default_rng(4)
    voice = VoicePrompt(x_vector=rng.standard_normal(cfg.talker.decoder.hidden_size).astype(np.float32),
                        ref_codes=rng.integers(0, 2048, (9, 16)), ref_text="Hello there.")  # fmt: skip
    clone = make(base, text="This is a test of the voice.", voice_prompt=voice, max_new_tokens=8)
    short = make(base, text="Good.", voice_prompt=voice, x_vector_only_mode=True, max_new_tokens=6)
    want = Qwen3TTSRunner(base[3], max_batch_size=2, max_len=256, ahead=False).generate_codes([short])[0]
    r = Qwen3TTSRunner(base[3], max_batch_size=2, max_len=256, ahead=False, prefill_budget=5)
    gone = Sequence(seq_id=0, payload=clone, slot=0)
    r.step(Batch(prefill=(gone,)))
    r.step(Batch(decode=(gone,)))
    assert gone.model_state.prompt is not None  # still going in
    r.release(gone)
    assert r.num_active == 0
    assert torch.equal(r.generate_codes([short])[0], want)  # its slot's next owner decodes as alone


# --- voice_cache ---


@pytest.mark.parametrize("size", [0, 2])
async def test_reference_audio_sent_again_is_not_extracted_again_while_it_is_kept(base, monkeypatch, size):
    monkeypatch.setenv(CACHE, str(size))
    rng = np.random.default_rng(5)
    clip_a, clip_b = (0.1 * rng.standard_normal(24000 * 2).astype(np.float32) for _ in range(2))

    def clone(clip, **kw):
        return SpeechRequest("Hello world.", ref_audio=clip, ref_text="Hello there.", max_new_tokens=6,
                             sampling=GREEDY, options=Qwen3TTSOptions(subtalker_sampling=GREEDY), **kw)  # fmt: skip

    sent = [clone(clip_a), clone(clip_a), clone(clip_a, x_vector_only_mode=True), clone(clip_b), clone(clip_a)]
    async with await AsyncEngine.from_pretrained(base[0], progress=False, max_batch_size=2) as engine:
        fam = engine.models.speech()
        extract, extracted = fam._extract_voice, []

        def counted(audio, ref_text):
            extracted.append(ref_text)
            return extract(audio, ref_text)

        fam._extract_voice = counted
        audio = [await _collect(engine, r) for r in sent]
    # kept (2 entries): the repeat reuses the first's prompt; the x-vector prompt of the same audio is another
    # entry; clip B pushes out the least recently used (A in context), so A is extracted again at the end
    assert extracted == (["Hello there.", None, "Hello there.", "Hello there."] if size else
                         ["Hello there.", "Hello there.", None, "Hello there.", "Hello there."])  # fmt: skip
    if size:
        assert (fam.voice_cache.hits, fam.voice_cache.misses, len(fam.voice_cache)) == (1, 4, 2)
    else:
        assert fam.voice_cache is None
    for again in (1, 4):  # the same reference speaks the same audio, kept or extracted again
        assert np.abs(audio[again] - audio[0]).max() < TOL


# --- the worker's wait for urgent jobs ---


async def test_the_worker_waits_for_urgent_items_only_and_never_past_its_bound():
    """``wait_for_urgent`` (called between two steps) returns once enough urgent items are queued, woken by their
    submissions; items submitted without ``urgent`` do not count, and a wait for more than come ends at its bound."""
    worker = DeviceWorker(name="urgent-test")  # not started: this test plays its thread

    def batch(items):
        return items

    waiting = anyio.Event()
    got: list[int] = []

    def wait() -> None:
        anyio.from_thread.run_sync(waiting.set)
        got.append(worker.wait_for_urgent(2, 60.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, wait)
        await waiting.wait()
        worker.submit_batched("plain", 1, batch)
        worker.submit_batched("first", 2, batch, urgent=True)
        worker.submit_batched("first", 3, batch, urgent=True)
    assert got == [2]
    assert await anyio.to_thread.run_sync(worker.wait_for_urgent, 3, 0.01) == 2  # the bound, not a third item
    worker.close()
