"""Greedy fp32 codes equal the reference ``qwen_tts`` implementation's, token for token, on tiny checkpoints."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from reference_qwen import GREEDY_KW, reference_wrapper, tiny_checkpoint, voice_clone_item
from safetensors.torch import load_file, save_file

from omni_stream.models.qwen3_tts.checkpoint import load_lm
from omni_stream.models.qwen3_tts.config import Qwen3TTSConfig, load_config
from omni_stream.models.qwen3_tts.options import Qwen3TTSOptions
from omni_stream.models.qwen3_tts.prompt import prepare_request
from omni_stream.models.qwen3_tts.runner import Qwen3TTSRunner
from omni_stream.models.qwen3_tts.tokenizer import TextTokenizer
from omni_stream.requests import SamplingParams, SpeechRequest, VoicePrompt

pytestmark = pytest.mark.reference

GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0, repetition_penalty=1.05)
SUB_GREEDY = SamplingParams(do_sample=False, temperature=1.0, top_k=0)
N = 16


@dataclass
class Side:
    cfg: Qwen3TTSConfig
    tok: TextTokenizer
    runner: Qwen3TTSRunner
    wrapper: object
    recorder: object

    def ours(self, **kw) -> torch.Tensor:
        kw.setdefault("max_new_tokens", N)
        req = SpeechRequest(sampling=GREEDY, options=Qwen3TTSOptions(subtalker_sampling=SUB_GREEDY), **kw)
        codes = self.runner.generate_codes([prepare_request(req, self.cfg, self.tok)])[0]
        assert self.runner.num_active == 0
        return codes


_SIDES: dict[Path, Side] = {}


def side(path: Path) -> Side:
    if path not in _SIDES:
        cfg = load_config(path)
        wrapper, recorder = reference_wrapper(path)
        runner = Qwen3TTSRunner(load_lm(path, dtype=torch.float32), max_batch_size=4, max_len=256)
        _SIDES[path] = Side(cfg, TextTokenizer(path, cfg.talker.text_vocab_size), runner, wrapper, recorder)
    return _SIDES[path]


@pytest.fixture(scope="module")
def cv06(tmp_path_factory) -> Side:
    return side(tiny_checkpoint(tmp_path_factory, "custom_voice", "0.6b"))


@pytest.fixture(scope="module")
def cv17(tmp_path_factory) -> Side:
    return side(tiny_checkpoint(tmp_path_factory, "custom_voice", "1.7b"))


@pytest.mark.parametrize(
    ("voice", "language", "instructions"),
    [
        ("ryan", "English", None),
        ("aiden", "Auto", None),
        ("dylan", "Auto", None),  # dialect speaker: auto -> beijing_dialect tag
        ("eric", "Chinese", None),  # dialect speaker: chinese -> sichuan_dialect tag
        ("eric", "English", None),  # no override outside chinese/auto
        ("vivian", "Auto", "speak slowly"),  # the 0.6B wrapper drops instructions
    ],
)
def test_custom_voice_matches_reference(cv06: Side, voice, language, instructions) -> None:
    text = "Hello world, this is a test."
    ours = cv06.ours(text=text, voice=voice, language=language, instructions=instructions)
    cv06.wrapper.generate_custom_voice(
        text=text, speaker=voice, language=language, instruct=instructions, max_new_tokens=N, **GREEDY_KW
    )
    assert ours.shape == (N - 1, 16)
    assert torch.equal(ours, cv06.recorder.codes[0])


def test_custom_voice_prompts_differ(cv06: Side) -> None:
    # Guards the parity tests against a degenerate tiny model that ignores its prompt.
    a = cv06.ours(text="Hello world.", voice="ryan", language="English")
    b = cv06.ours(text="Hello world.", voice="vivian", language="English")
    c = cv06.ours(text="Hello world.", voice="ryan", language="German")
    assert not torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("language", ["English", "Auto"])
def test_custom_voice_instructions_on_1p7b(cv17: Side, language) -> None:
    text, instruct = "Hello world, speak slowly.", "a calm deep male voice"
    ours = cv17.ours(text=text, voice="aiden", language=language, instructions=instruct)
    plain = cv17.ours(text=text, voice="aiden", language=language)
    cv17.wrapper.generate_custom_voice(
        text=text, speaker="aiden", language=language, instruct=instruct, max_new_tokens=N, **GREEDY_KW
    )
    assert torch.equal(ours, cv17.recorder.codes[0])
    assert not torch.equal(ours, plain)  # instructions reach the 1.7B prompt


def test_voice_design_matches_reference(tmp_path_factory) -> None:
    s = side(tiny_checkpoint(tmp_path_factory, "voice_design", "1.7b"))
    text, instruct = "Hello world.", "a happy female voice"
    for language in ("Auto", "English"):
        ours = s.ours(text=text, language=language, instructions=instruct)
        s.wrapper.generate_voice_design(text=text, instruct=instruct, language=language, max_new_tokens=N, **GREEDY_KW)
        assert torch.equal(ours, s.recorder.codes[0]), language


@pytest.mark.parametrize("size", ["0.6b", "1.7b"])
@pytest.mark.parametrize("n_ref", [3, 30])  # target text longer / shorter than the reference codes
@pytest.mark.parametrize("x_vector_only", [False, True])
def test_base_matches_reference(tmp_path_factory, size, n_ref, x_vector_only) -> None:
    s = side(tiny_checkpoint(tmp_path_factory, "base", size))
    rng = np.random.default_rng(n_ref)
    xv = rng.standard_normal(s.cfg.talker.decoder.hidden_size).astype(np.float32)
    ref_codes = rng.integers(0, 2048, (n_ref, 16))
    vp = VoicePrompt(x_vector=xv, ref_codes=ref_codes, ref_text="Hello world.")
    text = "This is a test of the voice."
    ours = s.ours(text=text, language="English", voice_prompt=vp, x_vector_only_mode=x_vector_only)
    item = voice_clone_item(xv, None if x_vector_only else ref_codes, vp.ref_text)
    s.wrapper.generate_voice_clone(
        text=text, language="English", voice_clone_prompt=[item], max_new_tokens=N, **GREEDY_KW
    )
    ref = s.recorder.codes[0]
    if not x_vector_only:
        assert torch.equal(ref[:n_ref], torch.as_tensor(ref_codes))  # the wrapper prepends the reference codes
        ref = ref[n_ref:]
    assert torch.equal(ours, ref)


def test_eos_frame_dropped_like_reference(tmp_path_factory, tmp_path) -> None:
    # A variant whose EOS logit copies (slightly above) a token the greedy run picks at frame 4: the run must
    # stop there (after min_new_tokens) exactly as the reference does, without emitting the EOS frame.
    src = tiny_checkpoint(tmp_path_factory, "custom_voice", "0.6b")
    base = side(src).ours(text="Hello world.", voice="ryan", language="English")
    dst = tmp_path / "eos"
    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    w = state["talker.codec_head.weight"]
    w[2150] = w[int(base[4, 0])] * 1.5
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    s = side(dst)
    ours = s.ours(text="Hello world.", voice="ryan", language="English")
    s.wrapper.generate_custom_voice(
        text="Hello world.", speaker="ryan", language="English", max_new_tokens=N, **GREEDY_KW
    )
    assert 2 <= ours.shape[0] < N - 1
    assert torch.equal(ours, s.recorder.codes[0])
    assert (ours[:, 0] != 2150).all()
