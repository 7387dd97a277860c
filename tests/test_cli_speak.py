"""`omni-stream speak` and `make-checkpoint` through the CLI entry point."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from omni_stream.cli import main
from omni_stream.models.qwen3_tts.config import load_config
from omni_stream.speech.limits import frame_budget


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
    assert "Invalid voice 'nobody'" in err and "--voice" in err and "Traceback" not in err
    assert not out.exists()


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("tiny-base") / "ckpt"
    assert main(["make-checkpoint", "--tiny", "--kind", "base", str(out)]) == 0
    return out


def test_speak_clones_the_voice_of_a_reference_file(tiny_base, tmp_path, capsys):
    ref = tmp_path / "ref.wav"
    t = np.arange(24000 * 2) / 24000
    sf.write(ref, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000, subtype="PCM_16")
    out = tmp_path / "clone.flac"  # any 16-bit PCM format soundfile writes
    args = ["speak", "--model", str(tiny_base), "--ref-audio", str(ref), "--ref-text", "hello there"]
    assert main([*args, "--max-new-tokens", "6", "-o", str(out), "Hello."]) == 0, capsys.readouterr().err
    wav, rate = sf.read(out, dtype="float32")
    assert rate == 24000 and wav.size > 0
    # without a transcript: the refusal names the flag that clones from the speaker embedding alone
    args = ["speak", "--model", str(tiny_base), "--ref-audio", str(ref), "--max-new-tokens", "6", "-o", str(out)]
    assert main([*args, "Hello."]) == 2
    assert "(--ref-text)" in capsys.readouterr().err
    assert main([*args, "--x-vector-only", "Hello."]) == 0, capsys.readouterr().err


def test_speak_reads_the_text_from_standard_input(tiny, tmp_path, capsys, monkeypatch):
    import io

    out = tmp_path / "stdin.wav"
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello from a pipe.\n"))
    args = ["speak", "--model", str(tiny), "--greedy", "--max-new-tokens", "5", "-o", str(out), "-"]
    assert main(args) == 0, capsys.readouterr().err
    assert sf.read(out)[0].size > 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("   \n"))
    assert main(args) == 2
    assert "(the text)" in capsys.readouterr().err  # an empty pipe is an empty text, not the text "-"


def test_speak_refuses_what_it_cannot_read_or_write_before_loading(tiny, tmp_path, capsys):
    for args, words in (
        (["-o", str(tmp_path / "x.mp4")], "names no 16-bit PCM format"),
        (["-o", str(tmp_path / "noext")], "names no 16-bit PCM format"),
        (["-o", str(tmp_path / "nodir" / "x.wav")], "does not exist"),
        (["--ref-audio", str(tmp_path / "missing.wav")], "missing.wav: no such file"),
        (["--ref-audio", str(tmp_path)], "not a file"),
    ):
        assert main(["speak", "--model", str(tmp_path / "never-loaded"), *args, "Hi."]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and "config.json" not in err, err
    assert main(["speak", "--model", str(tiny), "-o", str(tmp_path / "e.wav"), " "]) == 2
    assert "(the text)" in capsys.readouterr().err  # the positional argument, not a wire field's name


def test_speak_reports_a_missing_checkpoint(tmp_path, capsys):
    assert main(["speak", "--model", str(tmp_path / "missing"), "-o", str(tmp_path / "x.wav"), "Hi."]) == 2
    assert "missing does not exist" in capsys.readouterr().err  # the path itself, not a file inside it
    (tmp_path / "empty").mkdir()
    assert main(["speak", "--model", str(tmp_path / "empty"), "-o", str(tmp_path / "x.wav"), "Hi."]) == 2
    assert "config.json is missing" in capsys.readouterr().err


def test_speak_without_a_voice_uses_the_models_default_voice(tiny, tmp_path, capsys):
    out = tmp_path / "default.wav"
    assert main(["speak", "--model", str(tiny), "--seed", "1", "-o", str(out), "Hi there."]) == 0
    wav, _ = sf.read(out, dtype="float32")
    # no --max-new-tokens: the frame budget of the text bounds it (random weights never stop on their own)
    assert 0 < wav.size <= frame_budget("Hi there.") * 1920
    same = tmp_path / "first-voice.wav"
    voice = load_config(tiny).speakers[0]
    assert main(["speak", "--model", str(tiny), "--seed", "1", "--voice", voice, "-o", str(same), "Hi there."]) == 0
    assert np.array_equal(sf.read(same, dtype="float32")[0], wav)  # the default is the checkpoint's first voice


def test_speak_threads_flag_reaches_torch(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMNI_STREAM_THREADS", "1")  # the flag wins over the environment
    out = tmp_path / "t.wav"
    args = ["speak", "--model", str(tiny), "--threads", "2", "--max-new-tokens", "3", "-o", str(out), "Hi."]
    assert main(args) == 0
    # speak asks the device worker's own thread what torch runs with
    assert ", 2 torch threads" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["speak", "--threads", "0", "Hi."])
    with pytest.raises(SystemExit, match=r"--tune step_ahead must be on or off, got 'sideways'"):
        main(["speak", "--model", str(tiny), "--tune", "step_ahead=sideways", "Hi."])


def test_help_does_not_import_torch():
    code = "import sys; from omni_stream.cli import main; main(['--help'])"
    proc = subprocess.run([sys.executable, "-c", code + "\n"], capture_output=True, text=True)
    assert proc.returncode == 0 and "serve" in proc.stdout
    probe = "import sys, omni_stream.cli, omni_stream.realtime.server; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


def test_make_checkpoint_writes_whole_or_nothing_and_never_into_another_checkpoint(tiny, tmp_path, capsys):
    assert main(["make-checkpoint", "--tiny", "--kind", "asr", str(tiny)]) == 2  # a checkpoint is there already
    assert "not empty" in capsys.readouterr().err and load_config(tiny).speakers  # still the speech checkpoint
    whisper_config = tmp_path / "whisper"
    assert main(["make-checkpoint", "--tiny", "--kind", "asr", str(whisper_config)]) == 0
    out = tmp_path / "mixed"
    # a config of another family than --kind names: refused in one line, and nothing is left behind
    assert main(["make-checkpoint", "--from-config", str(whisper_config), "--kind", "custom_voice", str(out)]) == 2
    err = capsys.readouterr().err
    assert "expected 'qwen3_tts', got 'whisper'" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whisper"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["make-checkpoint", "--tiny", "--kind", "asr", str(empty)]) == 0  # an empty directory is fine
    assert (empty / "config.json").is_file()
