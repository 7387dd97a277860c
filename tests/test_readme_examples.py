"""The README's complete Python examples run as written, on the tiny checkpoints: each example's code block is taken
from README.md, its placeholder paths replaced by tiny checkpoints of the same layout, and run in a fresh
interpreter (each calls ``asyncio.run`` / ``anyio.run`` itself). A change of the API the README shows fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
from lm_helpers import tiny_lm_checkpoint
from serving_helpers import tts_checkpoint
from spoken import ESPEAK, speak

from omni_stream.models.whisper.checkpoint import write_tiny_checkpoint as write_tiny_whisper

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# each complete example, by the line that runs it
EXAMPLES = {"speech": "asyncio.run(main())", "chat": "asyncio.run(talk(", "listen": "anyio.run(listen,"}


def example(name: str) -> str:
    [code] = [b for b in BLOCK.findall(README.read_text()) if EXAMPLES[name] in b]
    return code


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("readme")
    if ESPEAK is not None:  # real speech between silences, as a user's recording would be
        samples, rate = speak("Hello, this is a test of the voice detector.")
        pause = np.zeros(rate, np.float32)
        soundfile.write(root / "speech.wav", np.concatenate([pause, samples, pause]), rate, subtype="PCM_16")
    return {
        "/path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice": str(tts_checkpoint()),
        "/path/to/Qwen3-0.6B": str(tiny_lm_checkpoint(tmp_path_factory)),
        "/path/to/whisper-large-v3-turbo": str(write_tiny_whisper(root / "whisper")),
        '"speech.wav"': repr(str(root / "speech.wav")),
    }


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_readme_example_runs_as_written(name, paths, tmp_path):
    if name == "listen" and ESPEAK is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng): the example listens to speech")
    code = example(name)
    for placeholder, path in paths.items():
        code = code.replace(placeholder, path)
    assert "/path/to" not in code, "a placeholder this test does not know"
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    if name == "speech":
        assert re.search(r"Usage\(input_tokens=\d+, output_tokens=[1-9]\d*[^)]*\) \d\.\d+", out), out  # usage, ttfa
    elif name == "chat":
        assert "{'text': Usage(" in out and "'speech': Usage(" in out and "speech Audio" in out, out[-2000:]
    else:
        assert "speech_started" in out and "speech_stopped" in out, out  # the VAD heard the speech
