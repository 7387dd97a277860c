"""The speech WebSocket's vLLM-Omni session fields: text_input_mode, word_timestamps, unknown fields and values, on
the tiny Qwen3-TTS (each unit's audio compared with what the model says for its text over HTTP)."""

from __future__ import annotations

import contextlib

import pytest
from serving_helpers import FRAME, Session, assert_same_pcm, spoken, units_of
from websockets.sync.client import connect

from omni_stream.realtime.speech.text_commit import TextCommitter, commit_text, forced_cut

PATH = "/v1/audio/speech/stream"

pytest_plugins = ("serving_fixtures",)

_open = contextlib.ExitStack()


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    _open.close()


def session(live_server, **config) -> Session:
    s = Session(_open.enter_context(connect(live_server.ws_url + PATH, open_timeout=10)))
    s.send(type="session.config", **config)
    return s


# --- commitment, pure ---


def test_commitment_commits_at_boundaries_no_later_text_can_change():
    assert commit_text("Hello there, how are", "English", 400) == (["Hello there,"], " how are")
    assert commit_text("It costs 3.50 dollars. Then", "English", 400) == (["It costs 3.50 dollars."], " Then")
    assert commit_text("It costs 3.", "English", 400) == ([], "It costs 3.")  # 3.50 may follow
    assert commit_text("Ask Dr. Smith", "English", 400) == ([], "Ask Dr. Smith")  # an abbreviation is no boundary
    assert commit_text("你好，世界。再见", "Chinese", 400) == (["你好，", "世界。"], "再见")
    assert commit_text("tail", "English", 400, final=True) == (["tail"], "")


def test_text_without_boundaries_is_committed_past_the_bound_holding_ambiguous_suffixes():
    # English: cut after a plain word; a trailing number (its unit or decimals may follow) and the last word wait
    spans, rest = commit_text("we walked along the river for 25", "English", 20)
    assert spans == ["we walked along the river for"] and rest == " 25"
    assert forced_cut("e.g. 25", "English") == 0  # nothing safe: an abbreviation, then a number
    # Chinese: cut between two ideographs; trailing digits wait (2026 reads differently before 年 and 元)
    spans, rest = commit_text("今年我们要去很多地方2026", "Chinese", 8)
    assert "".join(spans) + rest == "今年我们要去很多地方2026" and rest.endswith("2026") and spans
    assert all(len(span) <= 8 for span in spans)


def test_committer_buffers_like_the_splitter():
    c = TextCommitter("English", max_uncommitted=400)
    assert c.feed("One, two") == ["One,"] and c.pending == " two"
    assert c.feed(" three. Four") == ["two three."]
    assert c.flush() == ["Four"] and c.pending == ""
    with pytest.raises(ValueError):
        TextCommitter("Klingon")


# --- commitment over the wire ---


def test_committed_spans_are_synthesized_as_they_arrive(live_server):
    s = session(live_server, voice="vivian", response_format="pcm", text_input_mode="commitment", language="English")
    s.send(type="input.text", text="Hello there, how are")
    first = s.until("audio.done")  # before input.done: the committed span is already speaking
    assert first[0][1]["sentence_text"] == "Hello there," and first[0][1]["sentence_index"] == 0
    s.send(type="input.text", text=" you today? Fine")
    second = s.until("audio.done")
    assert second[0][1]["sentence_text"] == "how are you today?"
    s.send(type="input.done")
    rest = s.until("session.done")
    units = units_of(first + second + rest)
    assert [u["start"]["sentence_text"] for u in units] == ["Hello there,", "how are you today?", "Fine"]
    assert rest[-1][1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    for u in units:  # a unit may be batched with the next one: to one 16-bit step
        want = spoken(live_server, "vivian", u["start"]["sentence_text"], language="English")
        assert_same_pcm(b"".join(u["frames"]), want)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (
            {"text_input_mode": "commitment", "language": "English", "split_granularity": "sentence"},
            ["split_granularity='none'"],
        ),
        ({"text_input_mode": "commitment"}, ["explicit language", "'Auto'"]),
        ({"text_input_mode": "commitment", "language": "Klingon"}, ["'English' or 'Chinese'"]),
        ({"text_input_mode": "eager"}, ["text_input_mode", "'buffered', 'commitment'"]),
        ({"word_timestamps": True}, ["word_timestamps", "aligner"]),
        ({"stream_audio": "yes"}, ["stream_audio"]),
        ({"split_granularity": "word"}, ["split_granularity"]),
        ({"sample_rate": "fast"}, ["sample_rate"]),
        ({"spead": 1.5}, ["Unknown session.config field 'spead'"]),
        ({"non_streaming_mode": "yes"}, ["non_streaming_mode"]),
    ],
)
def test_bad_session_fields_are_errors_naming_the_field(live_server, config, words):
    s = session(live_server, voice="vivian", **config)
    kind, message = s.recv()
    assert kind == "json" and message["type"] == "error", message
    assert message["message"].startswith("Invalid session config: ")
    assert all(w in message["message"] for w in words), message
    assert s.closed_code() == 1008  # the first config: the session cannot start


def test_word_timestamps_on_a_later_config_keeps_the_session(live_server):
    s = session(live_server, voice="ryan", response_format="pcm")
    s.send(type="session.config", voice="ryan", word_timestamps=True)
    _kind, message = s.recv()
    assert message["type"] == "error" and "word_timestamps" in message["message"]
    s.send(type="input.text", text="Still here.")
    s.send(type="input.done")
    units = units_of(s.until("session.done"))
    assert b"".join(units[0]["frames"]) == spoken(live_server, "ryan", "Still here.")
    s.send(type="session.config", voice="ryan", word_timestamps=False)  # false is simply the default
    s.send(type="input.text", text="Again.")
    s.send(type="input.done")
    assert [m[1]["type"] for m in s.until("session.done") if m[0] == "json"][-1] == "session.done"


def test_vllm_omni_session_fields_are_accepted(live_server):
    s = session(
        live_server,
        model=live_server.engine.speech_info.model_name,
        speaker="serena",
        task_type="CustomVoice",
        language="Auto",
        response_format="pcm",
        speed=1.0,
        stream_audio=True,
        split_granularity="none",
        text_input_mode="buffered",
        word_timestamps=False,
        seed=3,
        max_new_tokens=6,
        non_streaming_mode=True,
    )
    s.send(type="input.text", text="All known fields.")
    s.send(type="input.done")
    units = units_of(s.until("session.done"))
    audio = b"".join(units[0]["frames"])
    assert len(audio) == 5 * FRAME * 2  # max_new_tokens 6: five frames (the runner's length rule)
    fields = {"language": "Auto", "seed": 3, "max_new_tokens": 6, "non_streaming_mode": True}
    assert audio == spoken(live_server, "serena", "All known fields.", **fields)
