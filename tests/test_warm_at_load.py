"""What a first request would pay once runs at load instead: the text model's chat template compiles, the ASR's
feature extractor runs once (a voice agent's first turn after start waited on both)."""

from __future__ import annotations

import numpy as np
from transformers import PreTrainedTokenizerFast, WhisperFeatureExtractor

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.family import ModelKind
from omni_stream.models.causal_lm.checkpoint import write_tiny_checkpoint as write_lm
from omni_stream.models.causal_lm.tokenizer import ChatTokenizer
from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint as write_whisper


def test_the_chat_template_is_rendered_once_when_the_tokenizer_loads(tmp_path, monkeypatch):
    ckpt = write_lm(tmp_path / "lm")
    rendered: list[list[dict]] = []
    apply = PreTrainedTokenizerFast.apply_chat_template

    def spy(self, conversation, *args, **kwargs):
        rendered.append(conversation)
        return apply(self, conversation, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerFast, "apply_chat_template", spy)
    tokenizer = ChatTokenizer(ckpt)
    assert tokenizer.has_chat_template
    assert [[m["role"] for m in c] for c in rendered] == [["user"]]


async def test_the_feature_extractor_runs_once_when_the_asr_loads(tmp_path, monkeypatch):
    ckpt = write_whisper(tmp_path / "whisper")
    calls: list[np.ndarray] = []
    call = WhisperFeatureExtractor.__call__

    def spy(self, raw, *args, **kwargs):
        calls.append(np.asarray(raw))
        return call(self, raw, *args, **kwargs)

    monkeypatch.setattr(WhisperFeatureExtractor, "__call__", spy)
    engine = await AsyncEngine.load({"asr": ModelSource(ckpt, kind=ModelKind.TRANSCRIPTION)}, progress=False)
    async with engine:
        assert len(calls) == 1 and calls[0].size == 16000 and not calls[0].any()  # a second of silence, at load
