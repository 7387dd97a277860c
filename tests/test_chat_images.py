"""Images in chat completions (OpenAI's ``image_url`` parts), end to end on the tiny random Qwen2.5-VL served by a
real uvicorn server: the ``openai`` SDK shows a picture and gets the tokens our engine gives for the same pixels;
the remote text backend passes a message's images through to such a server; bad pictures, pictures where they do
not belong and pictures to a model that does not see are 400s naming the field."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from lm_helpers import tiny_lm_checkpoint
from openai import AsyncOpenAI, BadRequestError
from PIL import Image
from serving_helpers import LiveServer, text_server
from vl_helpers import tiny_vl_checkpoint

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import InvalidRequestError
from omni_stream.family import ModelKind
from omni_stream.requests import GREEDY, ChatMessage, Role, TextRequest

QUESTION = "What is in this picture?"
TOKENS = 6


def picture(seed: int, size: tuple[int, int] = (40, 56)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)


def data_url(pixels: np.ndarray, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def shown(*urls: str, text: str = QUESTION) -> list[dict]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def vl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with text_server(tiny_vl_checkpoint(tmp_path_factory)) as live:
        yield live


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with text_server(tiny_lm_checkpoint(tmp_path_factory, "qwen3")) as live:
        yield live


async def local_answer(tmp_path_factory: pytest.TempPathFactory, pixels: np.ndarray) -> str:
    """The tiny Qwen2.5-VL's greedy reply to the picture and question, in an engine of this test's own."""
    source = ModelSource(tiny_vl_checkpoint(tmp_path_factory), kind=ModelKind.TEXT)
    async with await AsyncEngine.load({"llm": source}, progress=False) as engine:
        request = TextRequest(messages=(ChatMessage(Role.USER, QUESTION, images=(pixels,)),), max_tokens=TOKENS,
                              sampling=GREEDY)  # fmt: skip
        return "".join([out.chunk.text async for out in engine.chat(request)])


def sdk(live: LiveServer) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0)


def served(live: LiveServer) -> str:
    return live.engine.models.text().info.model_name


@pytest.mark.asyncio
async def test_the_openai_sdk_shows_a_picture_and_gets_the_engines_tokens_for_its_pixels(vl, tmp_path_factory):
    pixels = picture(1)
    client = sdk(vl)
    reply = await client.chat.completions.create(
        model=served(vl), messages=shown(data_url(pixels)), max_tokens=TOKENS, temperature=0
    )
    plain = await client.chat.completions.create(
        model=served(vl), messages=shown(text=QUESTION), max_tokens=TOKENS, temperature=0
    )
    stream = await client.chat.completions.create(
        model=served(vl), messages=shown(data_url(pixels)), max_tokens=TOKENS, temperature=0, stream=True
    )
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    # the picture reached the model: its tokens are in the prompt, as many as the family says it takes
    spent = vl.engine.models.text().count_image_tokens(pixels)
    assert reply.usage.prompt_tokens - plain.usage.prompt_tokens == spent
    assert reply.choices[0].message.content == streamed == await local_answer(tmp_path_factory, pixels)


@pytest.mark.asyncio
async def test_the_remote_backend_passes_a_messages_pictures_through(vl, tmp_path_factory):
    pixels = picture(2)
    request = TextRequest(messages=(ChatMessage(Role.USER, QUESTION, images=(pixels,)),), max_tokens=TOKENS,
                          sampling=GREEDY)  # fmt: skip
    async with await AsyncEngine.from_pretrained(llm_endpoint=vl.url, progress=False) as remote:
        assert remote.models.text().info.sees_images
        answer = "".join([out.chunk.text async for out in remote.chat(request)])
    assert answer == await local_answer(tmp_path_factory, pixels)


@pytest.mark.asyncio
async def test_a_server_whose_model_does_not_see_refuses_pictures_and_the_remote_backend_says_so(lm):
    client = sdk(lm)
    with pytest.raises(BadRequestError) as refused:
        await client.chat.completions.create(model=served(lm), messages=shown(data_url(picture(3))), max_tokens=2)
    assert refused.value.body["param"] == "messages" and "does not take images" in refused.value.body["message"]
    request = TextRequest(messages=(ChatMessage(Role.USER, QUESTION, images=(picture(3),)),), max_tokens=2)
    async with await AsyncEngine.from_pretrained(llm_endpoint=lm.url, progress=False) as remote:
        with pytest.raises(InvalidRequestError, match="does not take images"):
            async for _ in remote.chat(request):
                pass


def test_bad_pictures_and_pictures_where_they_do_not_belong_are_400s_naming_the_part(lm, vl):
    url = data_url(picture(4))
    part = "messages[0].content[0].image_url"
    too_many = shown(*[url] * 17)
    cases = [
        (vl, shown("data:image/png;base64,!!!"), f"{part}.url", "not valid base64"),
        (vl, shown("data:image/png;base64," + base64.b64encode(b"not a picture").decode()), f"{part}.url",
         "not a JPEG, PNG or WebP image"),
        (vl, shown("https://example.com/cat.png"), f"{part}.url", "remote images are not fetched"),
        (vl, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "max"}}]}],
         part, "detail' must be one of auto, low, high"),
        (vl, [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
         "messages[0].content", "must be a text part"),
        (vl, too_many, "messages", "at most 16 images"),
    ]  # fmt: skip
    for live, messages, param, words in cases:
        response = httpx.post(f"{live.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert response.status_code == 400, (messages, response.text)
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], error
    # a JPEG is a picture too: decoded, shown, answered
    jpeg = httpx.post(
        f"{vl.url}/v1/chat/completions", json={"messages": shown(data_url(picture(5), "JPEG")), "max_tokens": 2}
    )
    assert jpeg.status_code == 200 and jpeg.json()["usage"]["prompt_tokens"] > 0
