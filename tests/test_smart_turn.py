"""Smart Turn v3.2 (pipecat-ai's wheel): our log-mel features and onnxruntime inference against pipecat's own
``LocalSmartTurnAnalyzerV3`` on the same audio (the reference is used by this test only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pipecat.audio.turn.smart_turn._whisper_features import compute_whisper_log_mel_features
from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

from omni_stream.codecs.resample import resample
from omni_stream.errors import ConfigError
from omni_stream.models.smart_turn import SAMPLE_RATE, SmartTurn, available, log_mel, model_path
from omni_stream.models.smart_turn import model as smart_turn_model
from omni_stream.models.smart_turn.features import last_window
from omni_stream.models.smart_turn.graph import SmartTurnTorch
from omni_stream.models.smart_turn.model import default_threads, load_smart_turn, make_smart_turn
from omni_stream.runtime.settings import Tuning

pytestmark = pytest.mark.reference


def clips() -> dict[str, np.ndarray]:
    """Speech (espeak-ng where installed), a cut-off sentence, a tone, noise, a short clip, and more than 8 s."""
    rng = np.random.default_rng(0)
    t = np.arange(SAMPLE_RATE * 2) / SAMPLE_RATE
    out = {
        "tone": (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
        "noise": (0.05 * rng.standard_normal(SAMPLE_RATE * 3)).astype(np.float32),
        "short": (0.1 * rng.standard_normal(SAMPLE_RATE // 5)).astype(np.float32),
        "long": (0.1 * rng.standard_normal(SAMPLE_RATE * 11)).astype(np.float32),
    }
    try:
        from realtime_fixtures import espeak

        speech = espeak("What is the weather like in Paris today?").astype(np.float32) / 32768.0
        out["question"] = resample(speech, 24000, SAMPLE_RATE).astype(np.float32)
        out["cut off"] = out["question"][: out["question"].size // 2]
    except pytest.skip.Exception:
        pass
    return out


@pytest.fixture(scope="module")
def reference():
    analyzer = LocalSmartTurnAnalyzerV3(sample_rate=SAMPLE_RATE)
    analyzer.set_sample_rate(SAMPLE_RATE)
    return analyzer


def test_the_model_file_is_the_one_pipecat_loads(reference):
    assert available()
    assert model_path().name == "smart-turn-v3.2-cpu.onnx" and model_path().stat().st_size > 8_000_000


def test_features_equal_pipecats_on_every_clip():
    for name, audio in clips().items():
        window = last_window(audio)
        ours = log_mel(window[None])[0]
        theirs = compute_whisper_log_mel_features(window, do_normalize=True)
        assert ours.shape == theirs.shape == (80, 800), name
        np.testing.assert_allclose(ours, theirs, atol=1e-5, err_msg=name)


def test_probabilities_equal_pipecats_analyzer_on_the_same_audio(reference):
    model = SmartTurn()
    audio = clips()
    ours = model.probabilities(list(audio.values()))  # one batched call
    for (name, clip), p in zip(audio.items(), ours, strict=True):
        theirs = reference._predict_endpoint(clip)
        assert abs(p - theirs["probability"]) < 1e-4, name
        assert (p > 0.5) == (theirs["prediction"] == 1), name
        assert abs(model.probability(clip) - p) < 1e-5, name  # alone or in a batch: the same answer
    p = dict(zip(audio, ours, strict=True))
    assert p["tone"] < 0.5 < p["short"]  # the clips are told apart
    if "question" in p:  # a whole question is a finished turn, its first half is not
        assert p["question"] > 0.5 > p["cut off"]


def test_intra_op_threads_follow_the_cores_and_do_not_change_the_answer():
    assert [default_threads(n) for n in (1, 2, 7, 8, 16, 128)] == [1, 1, 1, 2, 4, 4]
    audio = list(clips().values())
    one, two = SmartTurn(threads=1), SmartTurn(threads=2)
    np.testing.assert_allclose(one.probabilities(audio), two.probabilities(audio), atol=1e-5)


def test_the_graph_run_by_torch_gives_onnxruntimes_answers_within_its_quantization_steps(reference):
    """``turn_model_device=cuda`` runs the same file's graph with torch (here on the CPU, the same code): every clip
    gets onnxruntime's decision and pipecat's analyzer's, and a probability within 0.06 of onnxruntime's (the graph is
    int8 throughout; onnxruntime's own unfused run of it differs from its fused run by up to 0.17 on these clips)."""
    audio = clips()
    ours = SmartTurnTorch(model_path(), "cpu").probabilities(list(audio.values()))
    ort = SmartTurn(threads=1).probabilities(list(audio.values()))
    assert ours.shape == ort.shape == (len(audio),)
    np.testing.assert_allclose(ours, ort, atol=0.06)
    for (name, clip), p in zip(audio.items(), ours, strict=True):
        theirs = reference._predict_endpoint(clip)
        assert (p > 0.5) == (theirs["prediction"] == 1), name


def test_the_staged_path_a_cuda_graph_replays_answers_as_the_plain_one_in_buckets_and_slices(monkeypatch):
    """On CUDA a call fills a static bucket (silent rows after the turns) and replays the bucket's graph of the
    features (by torch) and the model; more turns than a bucket holds go in slices. The same path, run eagerly on
    the CPU, gives the plain path's answers for every count: a bucket's padding rows and the slices change no turn's
    answer, and torch's features are numpy's."""
    from omni_stream.models.smart_turn import graph as graph_module
    from omni_stream.models.smart_turn.features import WINDOW, LogMelTorch, log_mel

    rng = np.random.default_rng(3)
    windows = (0.1 * rng.standard_normal((3, WINDOW))).astype(np.float32)
    windows[2, : WINDOW // 2] = 0  # a short turn: silence before it
    np.testing.assert_allclose(LogMelTorch()(torch.from_numpy(windows)).numpy(), log_mel(windows), atol=1e-5)

    monkeypatch.setattr(graph_module, "MAX_BATCH", 4)  # small buckets: 5 turns are a slice of 4 and one of 1
    plain = SmartTurnTorch(model_path(), "cpu")
    staged = SmartTurnTorch(model_path(), "cpu", staged=True)
    assert staged.buckets == (1, 2, 4) and not plain.staged
    audio = [*list(clips().values())[:3], windows[0], windows[2][WINDOW // 2 :]]
    expected = plain.probabilities(audio)
    for n in (1, 3, 5):  # 3: a bucket of 4 with one silent row
        np.testing.assert_allclose(staged.probabilities(audio[:n]), expected[:n], atol=1e-4)


def test_where_the_turn_model_runs_is_a_switch(monkeypatch):
    """``OMNI_STREAM_TURN_MODEL_DEVICE``: cpu is onnxruntime; cuda is the torch graph, refused where there
    is no CUDA device with a message that says so."""
    assert isinstance(make_smart_turn("cpu"), SmartTurn)
    # auto (default): the GPU where there is one
    assert Tuning().turn_model_device == "auto"
    auto = make_smart_turn("auto")
    assert isinstance(auto, SmartTurnTorch if torch.cuda.is_available() else SmartTurn)
    assert Tuning.from_env({"OMNI_STREAM_TURN_MODEL_DEVICE": "cuda"}).turn_model_device == "cuda"
    with pytest.raises(ConfigError, match="OMNI_STREAM_TURN_MODEL_DEVICE must be one of auto, cpu, cuda"):
        Tuning.from_env({"OMNI_STREAM_TURN_MODEL_DEVICE": "tpu"})
    if torch.cuda.is_available():
        assert isinstance(make_smart_turn("cuda"), SmartTurnTorch)
    else:
        monkeypatch.setattr(smart_turn_model, "_MODEL", None)
        monkeypatch.setenv("OMNI_STREAM_TURN_MODEL_DEVICE", "cuda")
        with pytest.raises(ConfigError, match="needs a CUDA device"):
            load_smart_turn()
