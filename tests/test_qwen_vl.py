"""Qwen2.5-VL on our engine (tiny random checkpoint, fp32, one torch thread): greedy tokens equal transformers'
``Qwen2_5_VLForConditionalGeneration.generate()`` on the same images and text, alone and batched with text-only
requests; prompts with images are fitted to the context; random aborts free every row."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import anyio
import numpy as np
import pytest
import torch
from lm_helpers import drive
from vl_helpers import tiny_vl_checkpoint

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import InvalidRequestError, RequestCancelled
from omni_stream.family import ModelKind
from omni_stream.models.causal_lm.config import load_generation_defaults
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.models.qwen_vl.config import load_config, load_image_spec
from omni_stream.models.qwen_vl.model import load_vl
from omni_stream.models.qwen_vl.prompt import encode_prompt
from omni_stream.models.qwen_vl.runner import QwenVLRunner, VLRequest
from omni_stream.requests import GREEDY, ChatMessage, Role, SamplingParams, TextRequest

transformers = pytest.importorskip("transformers")
torch.set_num_threads(1)

MAX_TOKENS = 8


def image(seed: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


PROMPTS = {
    "one image": (ChatMessage(Role.USER, "What is in this picture?", images=(image(1, 56, 84),)),),
    "two images": (
        ChatMessage(Role.USER, "Describe the scene.", images=(image(2, 70, 100),)),
        ChatMessage(Role.ASSISTANT, "A field."),
        ChatMessage(Role.USER, "Which of these differs?", images=(image(3, 112, 56), image(4, 60, 60))),
    ),
    "text only": (ChatMessage(Role.USER, "Hello world, how are you today?"),),
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_vl_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(ckpt) -> dict[str, list[int]]:
    """transformers' greedy tokens for each prompt: its tokenizer's template, its image processor, each image's
    pad repeated per merged patch as its processor does, generate() for MAX_TOKENS tokens (EOS ignored)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(ckpt))
    processor = Qwen2VLImageProcessorPil.from_pretrained(str(ckpt))
    pad = model.config.image_token_id
    out = {}
    for name, messages in PROMPTS.items():
        ids = list(tok.apply_chat_template([m.template() for m in messages], add_generation_prompt=True,
                                           tokenize=True)["input_ids"])  # fmt: skip
        images = [im for m in messages for im in m.images]
        kwargs = {}
        if images:
            pixels = processor(images=images, return_tensors="pt")
            counts = iter((pixels["image_grid_thw"].prod(-1) // 4).tolist())
            ids = [j for i in ids for j in ([i] * next(counts) if i == pad else [i])]
            kwargs = dict(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
        x = torch.tensor([ids])
        with torch.no_grad():
            gen = model.generate(input_ids=x, attention_mask=torch.ones_like(x), mm_token_type_ids=(x == pad).int(),
                                 max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0,
                                 **kwargs)  # fmt: skip
        out[name] = gen[0, len(ids) :].tolist()
    return out


async def load(ckpt, **options):
    return await AsyncEngine.load({"llm": ModelSource(ckpt, kind=ModelKind.TEXT)}, progress=False, **options)


def request(name: str, **fields) -> TextRequest:
    return TextRequest(messages=PROMPTS[name], max_tokens=MAX_TOKENS, sampling=GREEDY, ignore_eos=True, **fields)


async def reply(engine: AsyncEngine, req: TextRequest) -> tuple[str, str | None]:
    async with engine.chat(req) as stream:
        chunks = [o.chunk async for o in stream]
    return "".join(c.text for c in chunks), chunks[-1].finish_reason


def recorded(family) -> list[tuple[int, ...]]:
    out = sorted(tuple(t) for t in family.runner.recorded.values())
    family.runner.recorded.clear()
    return out


async def test_greedy_tokens_equal_transformers_alone_and_batched(ckpt, reference):
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(ckpt))
    async with await load(ckpt, max_batch_size=4) as engine:
        family = engine.models.text()
        assert family.info.sees_images and family.info.kind == ModelKind.TEXT
        family.runner.record = True
        for name in PROMPTS:  # each alone
            text, _ = await reply(engine, request(name))
            assert recorded(family) == [tuple(reference[name])], name
            assert text == tok.decode(reference[name], skip_special_tokens=True)
        assert family.runner.images_encoded == 4
        # All three in one batch: the scheduler admits them in one step, prefills them together and decodes
        # text-only and image rows side by side.
        steps_before = family.scheduler.stats.steps
        results = await asyncio.gather(*(reply(engine, request(n)) for n in PROMPTS))
        assert recorded(family) == sorted(tuple(reference[n]) for n in PROMPTS)
        assert [t for t, _ in results] == [tok.decode(reference[n], skip_special_tokens=True) for n in PROMPTS]
        assert family.scheduler.stats.max_batch == 3 and family.scheduler.stats.steps > steps_before


@pytest.mark.parametrize("join", [(0, 0, 0), (0, 2, 1), (3, 0, 1)])
async def test_image_and_text_rows_join_a_running_batch_at_any_step(ckpt, reference, join):
    """The real scheduler, stepped by hand: rows join while others decode (image newcomers beside text rows and
    the reverse), or all three prefill in one forward; each row's tokens are transformers'."""
    cfg = load_config(ckpt)
    tok = ChatTokenizer(ckpt)
    eos = load_generation_defaults(ckpt, cfg.text).eos_token_ids
    runner = QwenVLRunner(load_vl(ckpt, dtype=torch.float32), tok.decode, eos_token_ids=eos, max_batch_size=4,
                          max_len=256, record=True)  # fmt: skip
    spec = load_image_spec(ckpt, cfg.vision)
    requests = []
    for name in PROMPTS:
        p = encode_prompt(tok, cfg, spec, request(name))
        requests.append(VLRequest(p.ids, MAX_TOKENS, GREEDY, ignore_eos=True, images=p.images,
                                  positions=p.positions, rope_delta=p.rope_delta))  # fmt: skip
    runs = await drive(runner, requests, join)
    assert [r.tokens for r in runs] == [reference[n] for n in PROMPTS]
    if join == (0, 0, 0):
        assert runner.prefill_log[0][0] == 3  # one forward prefilled the three
    assert runner.num_active == 0 and runner.images_encoded == 4


async def test_an_image_prompt_is_fitted_to_the_context(ckpt):
    async with await load(ckpt, backend_args={"max_model_len": 64}) as engine:
        many = ChatMessage(Role.USER, "Compare them.", images=tuple(image(i, 112, 168) for i in range(3)))
        with pytest.raises(InvalidRequestError, match="does not fit the context") as err:
            await reply(engine, TextRequest(messages=(many,), max_tokens=4))
        assert err.value.param == "messages"
        one = ChatMessage(Role.USER, "This one?", images=(image(9, 56, 56),))
        with pytest.raises(InvalidRequestError, match="max_tokens") as err:
            await reply(engine, TextRequest(messages=(one,), max_tokens=60))
        assert err.value.param == "max_tokens"
        _, reason = await reply(engine, TextRequest(messages=(one,), max_tokens=3, ignore_eos=True))
        assert reason == "length"


async def test_random_aborts_free_every_row(ckpt, monkeypatch):
    async with await load(ckpt, max_batch_size=4, max_buffered_frames=4) as engine:
        family = engine.models.text()
        runner, sched = family.runner, family.scheduler
        probe = request("two images")
        before = await reply(engine, probe)
        await engine.worker.submit(lambda: None)  # the probe's release has run before the counting starts
        await engine.worker.submit(lambda: None)
        admitted: Counter[int] = Counter()
        released: Counter[int] = Counter()
        real_admit, real_release = runner._admit, runner.release

        def admit(seq):
            admitted[seq.seq_id] += 1
            return real_admit(seq)

        def release(seq):
            released[seq.seq_id] += 1
            return real_release(seq)

        monkeypatch.setattr(runner, "_admit", admit)
        monkeypatch.setattr(runner, "release", release)
        rng = random.Random(20261204)
        outcomes: Counter[str] = Counter()

        async def consume(mode: str, k: int) -> None:
            name = rng.choice(list(PROMPTS))
            sampling = SamplingParams(temperature=1.0) if rng.random() < 0.5 else GREEDY
            req = TextRequest(messages=PROMPTS[name], max_tokens=rng.randint(1, 12), sampling=sampling,
                              seed=rng.randrange(1 << 30), ignore_eos=True)  # fmt: skip
            try:
                async with engine.chat(req) as stream:
                    n = 0
                    async for _ in stream:
                        n += 1
                        if mode == "break" and n >= k:
                            break
                        if mode == "abort" and n >= k:
                            engine.abort(req.request_id)
            except RequestCancelled:
                outcomes["aborted"] += 1
            outcomes[mode] += 1

        async with anyio.create_task_group() as tg:
            for _ in range(24):
                tg.start_soon(consume, rng.choice(("break", "abort", "complete")), rng.randint(0, 4))
        await engine.worker.submit(lambda: None)
        await engine.worker.submit(lambda: None)
        assert sum(outcomes[m] for m in ("break", "abort", "complete")) == 24 and outcomes["aborted"] > 0
        assert sched.live() == dict.fromkeys(sched.live(), 0)
        assert runner.num_active == 0 and runner._states == {}
        assert set(admitted.values()) == {1} and released == admitted and sched.stats.max_batch > 1
        assert await reply(engine, probe) == before  # reused slots, rows and deltas give the same tokens
