"""Frame sessions of Qwen2.5-VL (tiny random checkpoint, fp32, one torch thread): frames prefilled into a held
cache as they arrive, a question prefilling only its own tokens, the window dropping the oldest frames; every path
gives the tokens of the whole prompt prefilled at once."""

from __future__ import annotations

import random
from collections import Counter

import anyio
import numpy as np
import pytest
import torch
from lm_helpers import drive
from vl_helpers import tiny_vl_checkpoint

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.models.causal_lm.config import load_generation_defaults
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.models.qwen_vl.config import load_config, load_image_spec
from omni_stream.models.qwen_vl.frames import image_key
from omni_stream.models.qwen_vl.model import load_vl
from omni_stream.models.qwen_vl.prompt import encode_prompt, session_prefix
from omni_stream.models.qwen_vl.runner import FrameIn, QwenVLRunner, VLRequest
from omni_stream.models.qwen_vl.vision import prepare_image
from omni_stream.requests import GREEDY, ChatMessage, Role, TextRequest

torch.set_num_threads(1)
MAX_TOKENS = 6


def frame(i: int) -> np.ndarray:
    """A 56 x 84 frame: 6 image tokens, 8 cache rows."""
    return np.random.default_rng(100 + i).integers(0, 256, (56, 84, 3), dtype=np.uint8)


def keys(images) -> list[bytes]:
    """The frames' pixels as comparable keys (a session keeps copies of the arrays it was sent)."""
    return [image_key(image) for image in images]


def question(messages: tuple[ChatMessage, ...], **fields) -> TextRequest:
    return TextRequest(messages=messages, max_tokens=MAX_TOKENS, sampling=GREEDY, ignore_eos=True, **fields)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_vl_checkpoint(tmp_path_factory)


async def load(ckpt, **backend_args):
    source = {"llm": ModelSource(ckpt, kind=ModelKind.TEXT)}
    return await AsyncEngine.load(source, progress=False, max_batch_size=4, backend_args=backend_args)


async def tokens(engine: AsyncEngine, request: TextRequest) -> list[int]:
    runner = engine.models.text().runner  # type: ignore[attr-defined]
    runner.record = True
    async with engine.chat(request) as stream:
        async for _ in stream:
            pass
    await engine.worker.submit(lambda: None)
    (out,) = runner.recorded.values()
    runner.recorded.clear()
    return out


async def test_a_question_prefills_only_its_own_tokens_and_answers_as_the_whole_prompt(ckpt):
    async with await load(ckpt) as engine:
        family = engine.models.text()
        runner = family.runner
        async with family.frame_session(max_frames=4, system="You watch a camera.") as session:
            for i in range(3):
                await session.add_frame(frame(i))
            assert len(session.frames) == 3 and runner.images_encoded == 3
            encoded, prefilled = runner.images_encoded, runner.tokens_prefilled
            messages = session.messages("What changed?")
            prompt = family.encode_prompt(question(messages))
            assert prompt.cached is not None and prompt.ids[: prompt.cached.length] == prompt.cached.ids
            image_pad = family.vl_config.image_token_id
            assert image_pad in prompt.cached.ids and image_pad not in prompt.ids[prompt.cached.length :]
            incremental = await tokens(engine, question(messages))
            assert runner.prefill_log[-1][2] == "continued"
            assert runner.tokens_prefilled - prefilled == len(prompt.ids) - prompt.cached.length  # the question
            assert runner.images_encoded == encoded  # the frames were not encoded again
            await session.add_frame(frame(3))  # a frame after the question was written: it still continues
            assert await tokens(engine, question(messages)) == incremental
            assert runner.prefill_log[-1][2] == "continued"
            assert family.encode_prompt(question(messages)).cached.ids == prompt.cached.ids
            encoded += 1
            # The same frames as other arrays (equal pixels) match too.
            same = tuple(f.copy() for f in messages[-1].images)
            copies = (*messages[:1], ChatMessage(Role.USER, "What changed?", images=same))
            assert await tokens(engine, question(copies)) == incremental
        assert runner.views == {}
        # The session closed: the whole prompt, frames through the vision tower again.
        rebuilt = await tokens(engine, question(messages))
        assert rebuilt == incremental and runner.images_encoded == encoded + 3
        assert runner.prefill_log[-1][2] == "eager"


async def test_the_window_drops_the_oldest_frames_and_the_rows_stay_bounded(ckpt):
    async with await load(ckpt, session_rows=48) as engine:  # the prompt's 3 rows and 5 frames of 8 rows fit
        family = engine.models.text()
        runner = family.runner
        async with family.frame_session(max_frames=8) as session:
            sent = [frame(i) for i in range(7)]
            for image in sent[:5]:
                await session.add_frame(image)
            assert keys(session.frames) == keys(sent[:5]) and runner.session_rebuilds == 0
            await session.add_frame(sent[5])  # 6 frames would need 51 rows: down to 6 of 8 frames' quarter
            view = runner.views[min(runner.views)]
            assert view.length <= 48 and runner.session_rebuilds == 1
            assert keys(session.frames) == keys(sent[6 - len(session.frames) : 6]) and len(session.frames) < 6
            await session.add_frame(sent[6])
            assert keys(session.frames[-1:]) == keys(sent[6:]) and runner.views[view.sid].length <= 48
            kept = session.frames
            incremental = await tokens(engine, question(session.messages("Describe them.")))
            assert runner.prefill_log[-1][2] == "continued"
        rebuilt = await tokens(engine, question((ChatMessage(Role.USER, "Describe them.", images=kept),)))
        assert rebuilt == incremental
        with pytest.raises(InvalidRequestError, match="max_frames"):
            async with family.frame_session(max_frames=0):
                pass


async def test_sessions_are_bounded_and_closing_frees_one(ckpt):
    async with await load(ckpt, max_sessions=1) as engine:
        family = engine.models.text()
        async with family.frame_session() as first:
            await first.add_frame(frame(0))
            with pytest.raises(InvalidRequestError, match="max_sessions"):
                async with family.frame_session():
                    pass
            with pytest.raises(InvalidRequestError, match="uint8 RGB") as err:
                await first.add_frame(np.zeros((56, 56), dtype=np.uint8))
            assert err.value.param == "image" and len(first.frames) == 1
        async with family.frame_session() as second:
            assert second.frames == ()


def hand_runner(ckpt, *, max_sessions: int):
    """A runner stepped by hand (the real scheduler in ``drive``), recording, and what builds its requests."""
    cfg = load_config(ckpt)
    tok = ChatTokenizer(ckpt)
    eos = load_generation_defaults(ckpt, cfg.text).eos_token_ids
    runner = QwenVLRunner(load_vl(ckpt, dtype=torch.float32), tok.decode, eos_token_ids=eos, max_batch_size=4,
                          max_len=256, record=True, max_sessions=max_sessions)  # fmt: skip
    return runner, tok, cfg, load_image_spec(ckpt, cfg.vision)


def runner_request(tok, cfg, spec, request: TextRequest, views=()) -> VLRequest:
    """``request`` as the runner's greedy payload (continuing one of ``views`` where its images are that session's)."""
    p = encode_prompt(tok, cfg, spec, request, views)
    return VLRequest(p.ids, MAX_TOKENS, GREEDY, ignore_eos=True, images=p.images, positions=p.positions,
                     rope_delta=p.rope_delta, cached=p.cached)  # fmt: skip


async def test_a_question_matched_before_a_rebuild_prefills_its_whole_prompt(ckpt):
    """The real scheduler stepped by hand: a question matched a session's rows, the window then rebuilt them
    before the question was admitted: it prefills its whole prompt from the stored features (no vision tower)."""
    runner, tok, cfg, spec = hand_runner(ckpt, max_sessions=1)

    def vl_request(request: TextRequest, views=()) -> VLRequest:
        return runner_request(tok, cfg, spec, request, views)

    def append(image: np.ndarray) -> None:
        runner.session_append(0, image, image_key(image), prepare_image(image, spec))

    runner.session_open(session_prefix(tok, cfg, None), max_frames=2)
    frames = [frame(i) for i in range(4)]
    for image in frames[:2]:
        append(image)
    early = question((ChatMessage(Role.USER, "And now?", images=tuple(frames[:2])),))
    stale = vl_request(early, tuple(runner.views.values()))
    assert stale.cached is not None
    append(frames[2])  # past the window: rebuilt
    assert runner.session_rebuilds == 1 and runner.views[0].generation != stale.cached.generation
    late = question((ChatMessage(Role.USER, "And now?", images=tuple(frames[1:3])),))
    current = vl_request(late, tuple(runner.views.values()))
    encoded = runner.images_encoded
    runs = await drive(runner, [stale, current])
    assert runner.images_encoded == encoded  # both from stored features
    assert sorted(kind for _, _, kind in runner.prefill_log[-2:]) == ["continued", "eager"]
    whole = await drive(runner, [vl_request(early), vl_request(late)])  # no session: patches, the vision tower
    assert [r.tokens for r in runs] == [r.tokens for r in whole]
    assert runner.images_encoded == encoded + 4


async def test_questions_of_several_sessions_are_prefilled_in_one_forward_and_answer_as_their_whole_prompts(ckpt):
    """Three sessions with different rows held (1, 3 and 2 frames, one with a system turn) and questions of
    different lengths, admitted in one step: one forward prefills the three questions, each after its own rows, and
    each answers as its whole prompt prefilled alone and as its question prefilled alone."""
    runner, tok, cfg, spec = hand_runner(ckpt, max_sessions=3)
    systems = (None, "You watch a camera.", None)
    held = {0: [frame(0)], 1: [frame(10 + i) for i in range(3)], 2: [frame(20), frame(21)]}
    for sid, system in enumerate(systems):
        runner.session_open(session_prefix(tok, cfg, system), max_frames=4)
        for image in held[sid]:
            runner.session_append(sid, image, image_key(image), prepare_image(image, spec))
    asks = ("What changed?", "Is anyone there, and what are they doing right now in the room?", "Describe it.")
    requests = []
    for sid, (system, ask) in enumerate(zip(systems, asks, strict=True)):
        turns = (ChatMessage(Role.SYSTEM, system),) if system else ()
        requests.append(question((*turns, ChatMessage(Role.USER, ask, images=tuple(held[sid])))))

    def vl_request(request: TextRequest, views=()) -> VLRequest:
        return runner_request(tok, cfg, spec, request, views)

    views = tuple(runner.views.values())
    continued = [vl_request(r, views) for r in requests]
    assert [c.cached.sid for c in continued] == [0, 1, 2]  # type: ignore[union-attr]
    assert len({c.cached.length for c in continued}) == 3  # type: ignore[union-attr]
    assert len({len(c.prompt_ids) - c.cached.length for c in continued}) == 3  # type: ignore[union-attr]
    runner.prefill_log.clear()
    together = await drive(runner, continued)
    assert runner.prefill_log[0][::2] == (3, "continued")  # the three questions in one forward
    assert runner.prefill_log[0][1] == max(len(c.prompt_ids) - c.cached.length for c in continued)  # type: ignore[union-attr]
    apart = [await drive(runner, [c]) for c in continued]
    whole = await drive(runner, [vl_request(r) for r in requests])
    assert [r.tokens for r in together] == [r.tokens for (r,) in apart] == [r.tokens for r in whole]
    assert all(len(r.tokens) == MAX_TOKENS for r in together)
    # Closer than tokens: the batched forward's last hidden state and K/V rows of each prompt equal those of its
    # whole prompt prefilled alone (the three in slots 0-2, each whole prompt then in slot 3).
    ids = [torch.tensor(c.prompt_ids) for c in continued]
    runner._prefill_continued([(i, ids[i], c) for i, c in enumerate(continued)])
    batched = runner.hidden[:3].clone()
    for i, request in enumerate(requests):
        runner._prefill_vl([(3, ids[i], vl_request(request))])
        torch.testing.assert_close(batched[i], runner.hidden[3], rtol=1e-4, atol=1e-4)
        n = len(ids[i])
        torch.testing.assert_close(runner.kv.k[:, i, :, :n], runner.kv.k[:, 3, :, :n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(runner.kv.v[:, i, :, :n], runner.kv.v[:, 3, :, :n], rtol=1e-4, atol=1e-4)


def test_frames_of_several_sessions_are_encoded_together_and_prefilled_as_one_by_one(ckpt):
    cfg = load_config(ckpt)
    tok = ChatTokenizer(ckpt)
    spec = load_image_spec(ckpt, cfg.vision)
    prefix = session_prefix(tok, cfg, None)

    def runner_with_two_sessions() -> QwenVLRunner:
        runner = QwenVLRunner(load_vl(ckpt, dtype=torch.float32), tok.decode, max_batch_size=2, max_len=256,
                              max_sessions=3)  # fmt: skip
        runner.session_open(prefix, max_frames=2)
        runner.session_open(prefix, max_frames=2)
        return runner

    def frame_in(sid: int, i: int) -> FrameIn:
        image = frame(i)
        return FrameIn(sid, image, image_key(image), prepare_image(image, spec))

    order = [(0, 0), (1, 1), (0, 2), (2, 9), (1, 3), (0, 4)]  # session 2 is not open; session 0 passes its window
    together = runner_with_two_sessions()
    out = together.session_append_many([frame_in(sid, i) for sid, i in order])
    assert together.vision_calls == 1 and together.images_encoded == 5
    assert isinstance(out[3], InvalidRequestError) and out[3].param == "session"
    one_by_one = runner_with_two_sessions()
    for sid, i in order:
        if sid != 2:
            one_by_one.session_append(sid, frame(i), image_key(frame(i)), prepare_image(frame(i), spec))
    assert one_by_one.vision_calls == 5
    for sid in (0, 1):
        a, b = together.views[sid], one_by_one.views[sid]
        assert a.ids == b.ids and [f.key for f in a.frames] == [f.key for f in b.frames]
        n = a.length
        torch.testing.assert_close(together.session_kv.k[:, sid, :, :n], one_by_one.session_kv.k[:, sid, :, :n])
        torch.testing.assert_close(together.session_kv.v[:, sid, :, :n], one_by_one.session_kv.v[:, sid, :, :n])
    assert [f.key for f in together.views[0].frames] == [image_key(frame(2)), image_key(frame(4))]
    assert together.session_rebuilds == one_by_one.session_rebuilds == 1


async def test_random_aborts_of_questions_beside_arriving_frames_free_every_row(ckpt):
    async with await load(ckpt) as engine:
        family = engine.models.text()
        runner, sched = family.runner, family.scheduler
        rng = random.Random(1204)
        outcomes: Counter[str] = Counter()
        async with family.frame_session(max_frames=4) as session:
            await session.add_frame(frame(0))

            async def ask(k: int) -> None:
                request = question(session.messages("What is new?"))
                async with engine.chat(request) as stream:
                    n = 0
                    async for _ in stream:
                        n += 1
                        if n >= k:
                            outcomes["break"] += 1
                            break
                    else:
                        outcomes["complete"] += 1

            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(ask, rng.randint(1, MAX_TOKENS + 1))
                    if i % 3 == 0:
                        await session.add_frame(frame(i + 1))
            await engine.worker.submit(lambda: None)
            await engine.worker.submit(lambda: None)
            assert outcomes["break"] > 0 and outcomes["complete"] > 0
            assert sched.live() == dict.fromkeys(sched.live(), 0) and runner._states == {}
            incremental = await tokens(engine, question(session.messages("Last one?")))
            kept = session.frames
        rebuilt = await tokens(engine, question((ChatMessage(Role.USER, "Last one?", images=kept),)))
        assert incremental == rebuilt and runner.views == {}
