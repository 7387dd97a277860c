"""Process-level knobs of the GPU path, checked without a GPU: the switch interval, codec stream, admission, the
burst hold."""

from __future__ import annotations

import sys

import pytest

from omni_stream.errors import ConfigError
from omni_stream.models.qwen3_tts.family import admission_rule, burst_hold, codec_stream_mode, step_ahead
from omni_stream.runtime.gil import ENV_SWITCH_INTERVAL, requested_interval_ms, shorten_switch_interval
from omni_stream.speech.admission import DEFAULT_HOLD_S, PlaybackAdmission


@pytest.fixture
def interval():
    saved = sys.getswitchinterval()
    yield
    sys.setswitchinterval(saved)


def test_the_switch_interval_is_shortened_to_half_a_millisecond_and_never_raised(interval) -> None:
    sys.setswitchinterval(0.005)
    assert shorten_switch_interval({}) == pytest.approx(0.0005)
    sys.setswitchinterval(0.0001)  # someone set it lower: left alone
    assert shorten_switch_interval({}) == pytest.approx(0.0001)
    sys.setswitchinterval(0.005)
    assert shorten_switch_interval({ENV_SWITCH_INTERVAL: "0"}) == pytest.approx(0.005)  # 0: leave it alone
    assert shorten_switch_interval({ENV_SWITCH_INTERVAL: "2"}) == pytest.approx(0.002)


@pytest.mark.parametrize("raw", ["fast", "-1", "5000"])
def test_a_bad_switch_interval_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match=ENV_SWITCH_INTERVAL):
        requested_interval_ms({ENV_SWITCH_INTERVAL: raw})


def test_codec_stream_and_admission_settings() -> None:
    assert codec_stream_mode({}) == "high"  # measured the faster (run 24)
    assert codec_stream_mode({"OMNI_STREAM_CODEC_STREAM": "off"}) == "off"
    assert codec_stream_mode({"OMNI_STREAM_CODEC_STREAM": " Normal "}) == "normal"
    assert codec_stream_mode({"OMNI_STREAM_CODEC_STREAM": "high"}) == "high"
    with pytest.raises(ConfigError):
        codec_stream_mode({"OMNI_STREAM_CODEC_STREAM": "thread"})
    assert admission_rule({}) is None
    assert admission_rule({"OMNI_STREAM_ADMISSION": "on"}) == PlaybackAdmission()
    assert admission_rule({"OMNI_STREAM_ADMISSION": "off"}) is None
    with pytest.raises(ConfigError):
        admission_rule({"OMNI_STREAM_ADMISSION": "maybe"})


def test_the_step_ahead_setting() -> None:
    assert step_ahead({}) is None  # the runner's default: on for CUDA devices
    assert step_ahead({"OMNI_STREAM_STEP_AHEAD": " On "}) is True
    assert step_ahead({"OMNI_STREAM_STEP_AHEAD": "off"}) is False
    with pytest.raises(ConfigError, match="OMNI_STREAM_STEP_AHEAD"):
        step_ahead({"OMNI_STREAM_STEP_AHEAD": "1"})


def test_the_burst_hold_setting() -> None:
    assert burst_hold({}) == DEFAULT_HOLD_S
    assert burst_hold({"OMNI_STREAM_BURST_HOLD_MS": " 20 "}) == pytest.approx(0.02)
    assert burst_hold({"OMNI_STREAM_BURST_HOLD_MS": "0"}) == 0.0  # never hold
    with pytest.raises(ConfigError, match="OMNI_STREAM_BURST_HOLD_MS must be a number of milliseconds"):
        burst_hold({"OMNI_STREAM_BURST_HOLD_MS": "soon"})
    for raw in ("-5", "2000"):
        with pytest.raises(ConfigError, match=r"OMNI_STREAM_BURST_HOLD_MS must be within 0\.\.1000 ms"):
            burst_hold({"OMNI_STREAM_BURST_HOLD_MS": raw})
