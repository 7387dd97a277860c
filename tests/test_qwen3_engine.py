"""Qwen3-TTS through the engine: streamed audio equals the whole decode, batching, errors, cleanup."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import anyio
import numpy as np
import pytest
import torch

from omni_stream.engine import AsyncEngine
from omni_stream.errors import ConfigError, InvalidRequestError, UnknownVoiceError, UnsupportedTaskError
from omni_stream.models.qwen3_tts import family as family_mod
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.requests import GREEDY, RequestState, SpeechRequest, VoicePrompt
from omni_stream.runtime.settings import Tuning

# Streaming with full decoder state is exact up to float rounding (fp32); the codec tests prove the same
# bound for the decoder alone.
TOL = 1e-4


@pytest.fixture(scope="module")
def custom_voice_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("cv"), "custom_voice", "0.6b", seed=1)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("base"), "base", "0.6b", seed=2)


def _greedy(text: str, **kw) -> SpeechRequest:
    kw.setdefault("max_new_tokens", 24)
    return SpeechRequest(text=text, sampling=GREEDY, options=Qwen3TTSOptions(subtalker_sampling=GREEDY), **kw)


async def _collect(engine: AsyncEngine, request: SpeechRequest) -> np.ndarray:
    async with engine.speech(request) as stream:
        parts = [a.samples async for a in stream]
    return np.concatenate(parts)


async def _expected(engine: AsyncEngine, request: SpeechRequest, voice_prompt=None) -> np.ndarray:
    """Codes from the runner's synchronous driver, decoded whole (on the worker thread, engine idle)."""
    fam = engine.models.speech()

    def run() -> np.ndarray:
        req = replace(request, sampling=request.sampling or fam.sampling)
        talker_request = prepare_request(req, fam.config, fam.tokenizer, voice_prompt=voice_prompt)
        codes = fam.runner.generate_codes([talker_request])[0]
        prompt = talker_request.prompt
        if prompt.ref_codes is not None:
            ref = torch.as_tensor(prompt.ref_codes)
            wav = fam.speech_tokenizer.decode(torch.cat([ref, codes]).T.unsqueeze(0))[0]
            return wav[ref.shape[0] * 1920 :].numpy()
        return fam.speech_tokenizer.decode(codes.T.unsqueeze(0))[0].numpy()

    return await engine.worker.submit(run)


async def _idle(engine: AsyncEngine) -> None:
    # Sessions release synchronously; the worker frees slots at its next iteration: let two go by.
    await engine.worker.submit(lambda: None)
    await engine.worker.submit(lambda: None)
    live = engine.models.speech().scheduler.live()
    assert live == dict.fromkeys(live, 0), live
    assert engine.models.speech().runner.num_active == 0


@pytest.mark.parametrize("initial", [1, 2, 5])
async def test_streamed_audio_equals_whole_decode(custom_voice_dir, initial):
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False) as engine:
        request = _greedy("Hello there, streaming world.", voice="ryan", initial_codec_chunk_frames=initial)
        streamed = await _collect(engine, request)
        expected = await _expected(engine, request)
        assert streamed.shape == expected.shape and streamed.size > 0
        assert np.abs(streamed - expected).max() < TOL
        await _idle(engine)


async def test_concurrent_requests_each_get_their_solo_audio(custom_voice_dir):
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, max_batch_size=4) as engine:
        requests = [
            _greedy("One two three.", voice="ryan"),
            _greedy("A different sentence here.", voice="vivian", language="English"),
            _greedy("Short.", voice="dylan", language="Chinese", max_new_tokens=10),
            _greedy("The fourth request joins too.", voice="aiden"),
            _greedy("And a fifth waits for a slot.", voice="serena"),
        ]
        solo = [await _collect(engine, r) for r in requests]
        together: list[np.ndarray | None] = [None] * len(requests)

        async def one(i: int) -> None:
            together[i] = await _collect(engine, requests[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(requests)):
                tg.start_soon(one, i)
        for a, b in zip(solo, together, strict=True):
            assert b is not None and a.shape == b.shape
            assert np.abs(a - b).max() < TOL
        await _idle(engine)


async def test_bad_requests_raise_typed_errors_and_leave_nothing(custom_voice_dir):
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False) as engine:
        with pytest.raises(UnknownVoiceError) as err:
            engine.speech("hi", voice="nobody")
        assert err.value.param == "voice" and "ryan" in str(err.value)
        with pytest.raises(UnsupportedTaskError) as err:
            engine.speech("hi", voice="ryan", task_type="VoiceDesign")
        assert err.value.param == "task_type"
        with pytest.raises(InvalidRequestError) as err:
            engine.speech("hi", voice="ryan", language="Klingon")
        assert err.value.param == "language" and "English" in str(err.value)
        with pytest.raises(InvalidRequestError) as err:
            engine.speech("hi", voice="ryan", max_new_tokens=5000)
        assert err.value.param == "max_new_tokens" and "4096" in str(err.value)
        with pytest.raises(UnsupportedTaskError):
            await engine.create_voice_prompt(np.zeros(24000, np.float32), 24000, "x")
        await _idle(engine)


async def test_closing_mid_stream_frees_the_slot(custom_voice_dir):
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False) as engine:
        stream = engine.speech(_greedy("A long request that we abandon early.", voice="ryan", max_new_tokens=200))
        first = await stream.__anext__()
        assert first.n_samples > 0
        await stream.aclose()
        # The release is synchronous; the worker frees the slot before its next step. A later request
        # runs to completion, proving the worker moved on.
        await _collect(engine, _greedy("next", voice="ryan", max_new_tokens=4))
        await _idle(engine)


async def test_base_cloning_streams_with_reference_context(base_dir):
    async with await AsyncEngine.from_pretrained(base_dir, progress=False) as engine:
        t = np.arange(24000 * 2) / 24000
        ref = (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)
        prompt = await engine.create_voice_prompt(ref, 24000, "a reference transcript")
        assert isinstance(prompt, VoicePrompt) and prompt.ref_codes is not None
        assert prompt.ref_codes.shape[1] == 16 and prompt.x_vector.ndim == 1
        request = _greedy("Cloned speech.", voice_prompt=prompt)
        streamed = await _collect(engine, request)
        expected = await _expected(engine, request, voice_prompt=prompt)
        assert streamed.shape == expected.shape and np.abs(streamed - expected).max() < TOL
        # x-vector only: no reference codes, no reference text needed
        xv = await _collect(engine, _greedy("Cloned speech.", ref_audio=ref, x_vector_only_mode=True))
        assert xv.size > 0
        with pytest.raises(InvalidRequestError) as err:
            engine.speech(_greedy("needs a transcript", ref_audio=ref))
        assert err.value.param == "ref_text"
        await _idle(engine)


REF_TEXT = "a reference transcript"


def _reference() -> np.ndarray:
    t = np.arange(24000 * 2) / 24000
    return (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


class HeldExtraction:
    """Holds every reference extraction of ``fam`` inside its speaker encoder until :meth:`release` (or the end of
    the ``with``); ``entered`` is set once one is held, ``threads`` names the threads that ran them."""

    def __init__(self, fam) -> None:
        self.fam, self.embed = fam, fam.speaker_encoder.embed
        self.held, self.entered, self.threads = threading.Event(), threading.Event(), set()

    def _slow_embed(self, audio):
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        self.held.wait(30)
        return self.embed(audio)

    def __enter__(self) -> HeldExtraction:
        self.fam.speaker_encoder.embed = self._slow_embed
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
        self.fam.speaker_encoder.embed = self.embed

    def release(self) -> None:
        self.held.set()

    async def started(self) -> None:
        await anyio.to_thread.run_sync(self.entered.wait, 30)


async def test_a_reference_is_extracted_beside_the_device_worker_which_streams_meanwhile(base_dir):
    """A Base request's reference audio is extracted on a thread of its own: while one extraction is held, a request
    with an uploaded voice streams to its end (extracted on the worker, as before, it would wait for it), and the held
    request then gets the audio of its own prompt."""
    async with await AsyncEngine.from_pretrained(base_dir, progress=False) as engine:
        ref = _reference()
        uploaded = await engine.create_voice_prompt(ref, 24000, REF_TEXT)
        request = _greedy("Cloned speech.", ref_audio=ref, ref_text=REF_TEXT)
        cloned: list[np.ndarray] = []
        with HeldExtraction(engine.models.speech()) as extraction:

            async def clone() -> None:
                cloned.append(await _collect(engine, request))

            async with anyio.create_task_group() as tg:
                tg.start_soon(clone)
                await extraction.started()
                with anyio.fail_after(60):  # the worker is free: the uploaded voice's request streams to its end
                    other = await _collect(engine, _greedy("Meanwhile.", voice_prompt=uploaded))
                assert other.size > 0 and not cloned
                extraction.release()
        assert extraction.threads and engine.worker.name not in extraction.threads
        expected = await _expected(engine, request, voice_prompt=uploaded)  # the same reference, extracted again
        assert cloned[0].shape == expected.shape and np.abs(cloned[0] - expected).max() < TOL
        await _idle(engine)


async def test_a_request_cancelled_during_its_reference_extraction_leaves_at_once_and_holds_nothing(base_dir):
    async with await AsyncEngine.from_pretrained(base_dir, progress=False) as engine:
        request = _greedy("Cancelled.", ref_audio=_reference(), ref_text=REF_TEXT)
        with HeldExtraction(engine.models.speech()) as extraction, anyio.CancelScope() as scope:

            async def cancel_once_extracting() -> None:
                await extraction.started()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once_extracting)
                with anyio.fail_after(20):  # the extraction is still held: the request does not wait for it
                    await _collect(engine, request)
        assert scope.cancelled_caught and extraction.entered.is_set()
        await _idle(engine)
        assert (await _collect(engine, request)).size > 0  # the held extraction ended; the next one runs
        await _idle(engine)


async def test_only_the_last_chunk_is_final_on_and_off_window_boundaries(custom_voice_dir):
    # Default ramp from 2 frames: windows 2, 4, 8, 16, 25: frame totals 2, 6 and 14 end on a boundary.
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False) as engine:
        for n, ignore_eos in [(2, True), (3, True), (6, True), (7, True), (14, True), (7, False), (15, False)]:
            request = _greedy("Hello there, streaming world.", voice="ryan", max_new_tokens=n, ignore_eos=ignore_eos)
            async with engine.speech(request) as stream:
                chunks = [a async for a in stream]
                frames = stream.usage.output_tokens
            assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True], (n, ignore_eos)
            assert sum(c.n_samples for c in chunks) == frames * 1920
            if ignore_eos:
                assert frames == n
        await _idle(engine)


async def test_the_talker_stage_is_the_shared_one(custom_voice_dir):
    from omni_stream.context import RequestContext
    from omni_stream.speech.stages import talker_stage

    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False) as engine:
        talker, _ = engine.models.speech().speech_stages(_greedy("hi", voice="ryan"), RequestContext())
        assert talker.__code__ is talker_stage(engine.models.speech().scheduler, None).__code__


async def test_load_problems_raise_config_errors_naming_the_field(custom_voice_dir, base_dir, monkeypatch):
    with pytest.raises(ConfigError, match="dtype"):
        await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, dtype="float8")
    with pytest.raises(ConfigError, match="load_format"):
        await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, load_format="pickle")
    real = family_mod.load_config
    monkeypatch.setattr(family_mod, "load_config", lambda path: replace(real(path), speaker_encoder=None))
    with pytest.raises(ConfigError, match="speaker_encoder_config"):
        await AsyncEngine.from_pretrained(base_dir, progress=False, load_format="dummy")


def test_embedded_default_checkpoint_is_built_once_and_says_it_speaks_noise(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        path = family_mod.embedded_default_checkpoint(tmp_path)
    assert (path / family_mod.EMBEDDED_MARKER).exists()
    assert "noise" in caplog.text
    assert sorted(p.name for p in tmp_path.joinpath("checkpoints").iterdir()) == [path.name]  # no temp leftovers
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert family_mod.embedded_default_checkpoint(tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime

    async def load() -> None:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            async with await AsyncEngine.from_pretrained(path, progress=False) as engine:
                assert engine.models.speech().embedded
        assert "speaks noise" in caplog.text

    anyio.run(load)


async def test_a_burst_prepares_its_prompts_on_a_few_threads_and_its_decoder_states_on_the_worker(
    custom_voice_dir, monkeypatch
):
    from omni_stream.models.qwen3_tts.codec_stream import CodecStreamState
    from omni_stream.runtime.offload import PREPARE_THREADS

    lock, running, most = threading.Lock(), [0], [0]
    real_prepare = family_mod.prepare_request

    def prepare(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.02)  # room for the burst's other preparations to start beside this one, were they allowed
            return real_prepare(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    made_on: list[str] = []
    real_zeros = CodecStreamState.zeros.__func__

    def zeros(cls, decoder, batch):
        made_on.append(threading.current_thread().name)
        return real_zeros(cls, decoder, batch)

    monkeypatch.setattr(family_mod, "prepare_request", prepare)
    monkeypatch.setattr(CodecStreamState, "zeros", classmethod(zeros))
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, max_batch_size=8) as engine:
        requests = [_greedy(f"Request number {i}.", voice="ryan", max_new_tokens=3) for i in range(8)]
        async with anyio.create_task_group() as tg:
            for r in requests:
                tg.start_soon(_collect, engine, r)
        # anyio's default pool would have run all eight at once (each one a thread taking turns at the GIL)
        assert 1 <= most[0] <= PREPARE_THREADS
        # each request's private decoder state is made by the worker, never on the event loop's thread
        assert len(made_on) == len(requests) and set(made_on) == {engine.worker.name}
        await _idle(engine)


async def test_stepping_ahead_streams_each_request_s_own_audio_through_pauses_and_aborts(custom_voice_dir):
    """The talker launching each step before handing out the last one's frames (the CUDA default, forced on
    here): a reader that stops reading pauses its row at the buffer's limit while the others run on, a request
    closed mid-stream leaves, and every finished stream equals its solo decode; nothing is held after."""
    ahead = Tuning.from_env(step_ahead=True)
    opts = {"progress": False, "max_batch_size": 4, "max_buffered_frames": 2, "tuning": ahead}
    async with await AsyncEngine.from_pretrained(custom_voice_dir, **opts) as engine:
        assert engine.models.speech().runner.ahead
        requests = [
            _greedy("One two three.", voice="ryan"),
            _greedy("A different sentence here.", voice="vivian", language="English"),
            _greedy("The slow reader's sentence.", voice="aiden", initial_codec_chunk_frames=1, max_new_tokens=80),
        ]
        expected = [await _expected(engine, r) for r in requests]
        others_done = anyio.Event()
        got: list[np.ndarray | None] = [None] * len(requests)
        paused_seen: list[bool] = []

        async def fast(i: int) -> None:
            got[i] = await _collect(engine, requests[i])

        async def slow() -> None:
            async with engine.speech(requests[2]) as stream:
                parts = [(await stream.__anext__()).samples]
                await others_done.wait()  # its row fills its buffer and pauses meanwhile
                parts += [a.samples async for a in stream]
            got[2] = np.concatenate(parts)

        async def abandoned() -> None:
            stream = engine.speech(_greedy("Left after one chunk.", voice="dylan", max_new_tokens=60))
            await stream.__anext__()
            await stream.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            tg.start_soon(abandoned)
            async with anyio.create_task_group() as inner:
                for i in (0, 1):
                    inner.start_soon(fast, i)
            states = [seq.state for seq in engine.models.speech().scheduler.running.values()]
            paused_seen.append(RequestState.PAUSED in states)
            others_done.set()
        for want, have in zip(expected, got, strict=True):
            assert have is not None and have.shape == want.shape
            assert np.abs(have - want).max() < TOL
        assert paused_seen == [True]
        await _idle(engine)


async def test_a_numpy_seed_is_a_seed_and_never_fails_the_batch_it_joins(custom_voice_dir):
    """A seed given as a numpy integer once reached the talker's step as one and overflowed there, failing every
    request admitted in that step; the request now holds a Python int, and sampling with it is seeding with it."""
    sampled = SpeechRequest(text="Seeded speech.", voice="ryan", max_new_tokens=12)
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, max_batch_size=4) as engine:
        alone = await _collect(engine, replace(sampled, seed=42, request_id="alone"))
        numpy_seeded = replace(sampled, seed=np.int64(42), request_id="numpy")
        assert type(numpy_seeded.seed) is int
        outs: dict[str, np.ndarray] = {}

        async def one(request: SpeechRequest) -> None:
            outs[request.request_id] = await _collect(engine, request)

        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(one, _greedy(f"Neighbour number {i}.", voice="vivian", request_id=f"n{i}"))
            tg.start_soon(one, numpy_seeded)
        assert set(outs) == {"n0", "n1", "numpy"}
        assert np.abs(outs["numpy"] - alone).max() < TOL
        await _idle(engine)
