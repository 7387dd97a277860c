"""`omni-stream speak` and `make-checkpoint` through the CLI entry point."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from omni_stream.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("tiny") / "ckpt"
    assert main(["make-checkpoint", "--tiny", "--kind", "custom_voice", str(out)]) == 0
    assert (out / "config.json").is_file() and (out / "speech_tokenizer" / "model.safetensors").is_file()
    return out


def test_speak_writes_a_wav_of_the_generated_frames(tiny, tmp_path, capsys):
    out = tmp_path / "hello.wav"
    args = ["speak", "--model", str(tiny), "--voice", "ryan", "--greedy", "--max-new-tokens", "9", "-o", str(out)]
    assert main([*args, "Hello there."]) == 0
    wav, rate = sf.read(out, dtype="float32")
    assert rate == 24000
    # at most 9 code-0 samples -> at most 8 frames of 1920 samples each; EOS may end it earlier
    assert 0 < wav.size <= 8 * 1920 and wav.size % 1920 == 0
    assert np.isfinite(wav).all() and np.abs(wav).max() > 0
    assert "wrote" in capsys.readouterr().err


def test_speak_reports_a_bad_voice_without_a_traceback(tiny, tmp_path, capsys):
    out = tmp_path / "x.wav"
    assert main(["speak", "--model", str(tiny), "--voice", "nobody", "-o", str(out), "Hi."]) == 2
    err = capsys.readouterr().err
    assert "unknown voice 'nobody'" in err and "--voice" in err and "Traceback" not in err
    assert not out.exists()


def test_speak_reports_a_missing_checkpoint(tmp_path, capsys):
    assert main(["speak", "--model", str(tmp_path / "missing"), "-o", str(tmp_path / "x.wav"), "Hi."]) == 2
    assert "config.json is missing" in capsys.readouterr().err
