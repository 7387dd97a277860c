"""Voice cloning with a transcript that cannot be the reference's: a 400 naming ``ref_text``, never audio.

In-context cloning lays the transcript beside the reference's codec frames. A transcript of more than 100
characters a second of reference (five times the fastest real speech) is not this audio's (a pasted paragraph, the
wrong file). Before, such a request answered 200 with whatever the model made of it (the surplus transcript ran
into the frames meant for ``input``) and an upload kept the voice; a 300,000-character transcript was accepted too.
"""

from __future__ import annotations

import base64

import httpx
import pytest
from serving_helpers import TTS_FRAMES, running_server, wav_bytes
from tiny_models import tiny_tts

from omni_stream.realtime.settings import Settings

REFERENCE = wav_bytes(2.0)  # 25 codec frames
TOO_LONG = "Hello there, this is far too much text. " * 6  # 240 characters for two seconds of audio (at most 200)

pytest_plugins = ("serving_fixtures",)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    voices = tmp_path_factory.mktemp("voices")
    with running_server(tiny_tts("base", greedy_frames=TTS_FRAMES + 1), Settings(voices_dir=voices)) as server:
        yield server


def speech(client: httpx.Client, ref_text: str, **fields) -> httpx.Response:
    reference = base64.b64encode(REFERENCE).decode()
    body = {"input": "Hi.", "ref_audio": reference, "ref_text": ref_text, "response_format": "pcm", **fields}
    return client.post("/v1/audio/speech", json=body)


@pytest.mark.parametrize("mode", [{}, {"stream": True}, {"stream_format": "audio"}])
def test_a_transcript_longer_than_its_reference_is_refused_naming_ref_text(live, mode):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        r = speech(c, TOO_LONG, **mode)
        assert r.status_code == 400, r.text[:200]
        error = r.json()["error"]
        assert error["param"] == "ref_text" and error["type"] == "BadRequestError"
        assert error["message"].startswith("ref_text too long for its reference audio (239 characters for 2.0s")
        assert speech(c, "Hello there.", **mode).status_code == 200  # a real transcript still clones


def test_x_vector_only_cloning_ignores_the_transcript(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        assert speech(c, TOO_LONG, x_vector_only_mode=True).status_code == 200  # no in-context prompt to check


def test_an_upload_whose_transcript_cannot_be_its_audio_is_refused_and_not_kept(live):
    with httpx.Client(base_url=live.url, timeout=60) as c:
        files = {"audio_sample": ("v.wav", REFERENCE, "audio/wav")}
        r = c.post("/v1/audio/voices", data={"name": "wrong", "consent": "yes", "ref_text": TOO_LONG}, files=files)
        assert r.status_code == 400 and r.json()["error"]["param"] == "ref_text", r.text[:200]
        assert c.get("/v1/audio/voices").json()["voices"] == []
        r = c.post("/v1/audio/voices", data={"name": "right", "consent": "yes", "ref_text": "Hi."}, files=files)
        assert r.status_code == 200, r.text
        # a request may give its own transcript for an uploaded voice: the same rule holds
        r = c.post("/v1/audio/speech", json={"input": "Hi.", "voice": "right", "ref_text": TOO_LONG})
        assert r.status_code == 400 and r.json()["error"]["param"] == "ref_text", r.text[:200]
        assert c.delete("/v1/audio/voices/right").status_code == 200
