"""The one tuning object: every OMNI_STREAM_* switch is parsed by one parser per kind of value, and reaches the
code it controls (the engine's worker and preparer, the Qwen3-TTS family's runner and scheduler, the kernel sets
and the codec on CUDA, the serving layer); no module outside the settings module reads the environment."""

from __future__ import annotations

import ast
import functools
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from omni_stream.engine import AsyncEngine, ModelSource
from omni_stream.errors import ConfigError
from omni_stream.models.qwen3_tts.checkpoint import write_tiny_checkpoint
from omni_stream.models.qwen3_tts.codec import vocoder_kernels
from omni_stream.models.qwen3_tts.family import codec_stream_priority
from omni_stream.runtime import decoder_kernels as fused
from omni_stream.runtime.gil import shorten_switch_interval
from omni_stream.runtime.offload import preparer
from omni_stream.runtime.settings import PDL_KERNELS, SWITCHES, Tuning
from omni_stream.speech.admission import PlaybackAdmission

ROOT = Path(__file__).resolve().parents[1]
ON_OFF = [s for s in SWITCHES if s.kind.expected == "on or off"]


@pytest.fixture(scope="module")
def custom_voice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("cv"), "custom_voice", "0.6b", seed=1)


# --- parsing: one vocabulary per kind of value, one message each ---------------------------------------------


@pytest.mark.parametrize("switch", ON_OFF, ids=lambda s: s.env)
def test_every_on_off_switch_takes_on_and_off_and_the_old_1_and_0(switch) -> None:
    for raw, value in (("on", True), (" ON ", True), ("1", True), ("off", False), ("Off", False), ("0", False)):
        assert getattr(Tuning.from_env({switch.env: raw}), switch.name) is value
    for bad in ("yes", "true", "2", "enabled"):
        with pytest.raises(ConfigError, match=rf"^{switch.env} must be on or off, got '{bad}'$"):
            Tuning.from_env({switch.env: bad})


def test_unset_or_blank_switches_take_their_defaults() -> None:
    assert Tuning.from_env({}) == Tuning() == Tuning.from_env({s.env: "  " for s in SWITCHES})
    t = Tuning()
    assert (t.threads, t.prepare_threads, t.switch_interval_ms, t.burst_hold_ms) == (None, 2, 0.5, 50.0)
    assert t.fused and not t.predictor_kernel and not t.admission and t.step_ahead is None
    assert (t.small_rows, t.predictor_small_rows, t.pdl) == (16, None, PDL_KERNELS)
    assert (t.codec_stream, t.codec_phases, t.codec_channels_last) == ("high", {3, 9}, None)


@pytest.mark.parametrize(
    ("env", "raw", "field", "value"),
    [
        ("OMNI_STREAM_CACHE", "/tmp/c", "cache_dir", Path("/tmp/c")),
        ("OMNI_STREAM_THREADS", " 3 ", "threads", 3),
        ("OMNI_STREAM_PREPARE_THREADS", "40", "prepare_threads", 40),
        ("OMNI_STREAM_SWITCH_INTERVAL_MS", "2", "switch_interval_ms", 2.0),
        ("OMNI_STREAM_SMALL_ROWS", "0", "small_rows", 0),
        ("OMNI_STREAM_PREDICTOR_SMALL_ROWS", "4", "predictor_small_rows", 4),
        ("OMNI_STREAM_PDL", "linear, Norm", "pdl", {"linear", "norm"}),
        ("OMNI_STREAM_PDL", "0", "pdl", frozenset()),
        ("OMNI_STREAM_PDL", "on", "pdl", PDL_KERNELS),
        ("OMNI_STREAM_CODEC_STREAM", " Normal ", "codec_stream", "normal"),
        ("OMNI_STREAM_CODEC_PHASES", " 3, 9 ", "codec_phases", {3, 9}),
        ("OMNI_STREAM_CODEC_PHASES", "none", "codec_phases", frozenset()),
        ("OMNI_STREAM_BURST_HOLD_MS", " 20 ", "burst_hold_ms", 20.0),
    ],
)
def test_valued_switches_parse(env, raw, field, value) -> None:
    assert getattr(Tuning.from_env({env: raw}), field) == value


@pytest.mark.parametrize(
    ("env", "raw", "expected"),
    [
        ("OMNI_STREAM_THREADS", "0", "a whole number within 1..4096"),
        ("OMNI_STREAM_PREPARE_THREADS", "65", "a whole number within 1..64"),
        ("OMNI_STREAM_PREPARE_THREADS", "two", "a whole number within 1..64"),
        ("OMNI_STREAM_SMALL_ROWS", "17", "a whole number within 0..16"),
        ("OMNI_STREAM_PREDICTOR_SMALL_ROWS", "-1", "a whole number within 0..16"),
        ("OMNI_STREAM_SWITCH_INTERVAL_MS", "fast", "a number of milliseconds within 0..1000"),
        ("OMNI_STREAM_BURST_HOLD_MS", "2000", "a number of milliseconds within 0..1000"),
        ("OMNI_STREAM_PDL", "linear,gemm", "on (all), off (none) or a comma-separated list of attention, linear"),
        ("OMNI_STREAM_CODEC_STREAM", "thread", "one of high, normal, off"),
        ("OMNI_STREAM_CODEC_PHASES", "3;9", "none or a comma-separated list of 3, 9"),
        ("OMNI_STREAM_CODEC_PHASES", "1", "none or a comma-separated list of 3, 9"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_values_it_takes(env, raw, expected) -> None:
    with pytest.raises(ConfigError, match=rf"^{env} must be {re.escape(expected)}.*, got '{re.escape(raw)}'$"):
        Tuning.from_env({env: raw})


def test_typed_values_are_checked_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^small_rows must be a whole number within 0\.\.16, got 20$"):
        Tuning(small_rows=20)
    with pytest.raises(ConfigError, match=r"^codec_stream must be one of high, normal, off"):
        Tuning(codec_stream="fast")
    assert Tuning(codec_phases={9}).codec_phases == frozenset({9})  # any collection becomes a frozenset


def test_the_old_negative_fused_switch_is_still_understood() -> None:
    assert Tuning.from_env({"OMNI_STREAM_NO_FUSED": "1"}).fused is False
    assert Tuning.from_env({"OMNI_STREAM_NO_FUSED": "0"}).fused is True
    with pytest.raises(ConfigError, match="OMNI_STREAM_NO_FUSED and OMNI_STREAM_FUSED disagree"):
        Tuning.from_env({"OMNI_STREAM_NO_FUSED": "1", "OMNI_STREAM_FUSED": "on"})
    with pytest.raises(ConfigError, match=r"^OMNI_STREAM_NO_FUSED must be on or off, got 'x'$"):
        Tuning.from_env({"OMNI_STREAM_NO_FUSED": "x"})


def test_flags_override_the_environment_by_field_name() -> None:
    env = Tuning.from_env({"OMNI_STREAM_STEP_AHEAD": "on", "OMNI_STREAM_ADMISSION": "on"})
    flagged = env.with_assignments(["step_ahead=off", "codec-phases=9", "admission="])
    assert (flagged.step_ahead, flagged.codec_phases, flagged.admission) == (False, {9}, False)  # blank: default
    with pytest.raises(ConfigError, match=r"^--tune step_ahead must be on or off, got 'sideways'$"):
        env.with_assignments(["step_ahead=sideways"])
    with pytest.raises(ConfigError, match=r"--tune takes NAME=VALUE with NAME one of: cache_dir, threads"):
        env.with_assignments(["warp=9"])
    with pytest.raises(ConfigError, match="--tune takes NAME=VALUE"):
        env.with_assignments(["api_key=k"])  # the key is a serve flag of its own


def test_the_api_key_is_read_but_never_shown() -> None:
    tuning = Tuning.from_env({"OMNI_STREAM_API_KEY": "sekrit", "OMNI_STREAM_ADMISSION": "on"})
    assert tuning.api_key == "sekrit"
    assert "sekrit" not in repr(tuning) and "sekrit" not in tuning.describe()
    assert "admission=on" in tuning.describe().split()


def test_describe_prints_every_switch_in_the_environments_spelling() -> None:
    shown = dict(p.split("=", 1) for p in Tuning.from_env({"OMNI_STREAM_PDL": "norm,rope"}).describe().split())
    assert set(shown) == {s.name for s in SWITCHES if not s.secret}
    assert shown["pdl"] == "norm,rope" and shown["fused"] == "on" and shown["threads"] == "auto"
    for switch in SWITCHES:  # what it prints parses back to the same value, "auto" (the code's own choice) too
        if not switch.secret and switch.name != "cache_dir":
            assert switch.parse(shown[switch.name]) == getattr(Tuning.from_env({"OMNI_STREAM_PDL": "norm,rope"}),
                                                               switch.name)  # fmt: skip
    assert Tuning.from_env({"OMNI_STREAM_STEP_AHEAD": "auto"}).step_ahead is None


def test_the_cache_directory_is_a_directory_and_reads_a_home_as_a_shell_does(tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="OMNI_STREAM_CACHE must be a directory path"):
        Tuning.from_env({"OMNI_STREAM_CACHE": str(tmp_path / "file")})
    assert Tuning.from_env({"OMNI_STREAM_CACHE": "~/omni-cache"}).cache_dir == Path.home() / "omni-cache"


# --- every switch reaches the code it controls ----------------------------------------------------------------


async def test_the_engine_parses_the_environment_once_and_hands_it_to_the_family(custom_voice_dir, monkeypatch):
    """step_ahead, admission and burst_hold_ms choose the Qwen3-TTS runner's and scheduler's code paths;
    prepare_threads the loop's preparer; threads the device worker's torch threads."""
    for name, value in {
        "OMNI_STREAM_STEP_AHEAD": "on",
        "OMNI_STREAM_ADMISSION": "on",
        "OMNI_STREAM_BURST_HOLD_MS": "20",
        "OMNI_STREAM_PREPARE_THREADS": "3",
        "OMNI_STREAM_THREADS": "2",
    }.items():
        monkeypatch.setenv(name, value)
    before = torch.get_num_threads()
    try:
        async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, max_batch_size=2) as engine:
            family = engine.models.speech()
            assert engine.tuning == Tuning.from_env()
            assert family.runner.ahead is True  # CPU's own default is off
            assert family.scheduler.admission == PlaybackAdmission()
            assert family.scheduler.hold == pytest.approx(0.02)
            assert preparer().threads == 3
            assert engine.worker.threads == 2 and await engine.worker.submit(torch.get_num_threads) == 2
            async with engine.speech("Hi.", voice="ryan", max_new_tokens=3) as stream:
                assert [a async for a in stream]  # and it still speaks
    finally:
        torch.set_num_threads(before)


async def test_a_tuning_passed_to_the_engine_wins_over_the_environment(custom_voice_dir, monkeypatch):
    monkeypatch.setenv("OMNI_STREAM_STEP_AHEAD", "on")
    monkeypatch.setenv("OMNI_STREAM_ADMISSION", "on")
    tuning = Tuning.from_env(step_ahead=False, admission=False, burst_hold_ms=0.0)
    async with await AsyncEngine.from_pretrained(custom_voice_dir, progress=False, tuning=tuning) as engine:
        family = engine.models.speech()
        assert not family.runner.ahead and family.scheduler.admission is None and family.scheduler.hold == 0.0


async def test_the_cache_dir_holds_the_embedded_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_STREAM_CACHE", str(tmp_path / "from-env"))  # the tuning passed wins
    tuning = Tuning.from_env(cache_dir=tmp_path / "given")
    async with await AsyncEngine.load({"asr": ModelSource(kind="transcription")}, progress=False, tuning=tuning):
        pass
    assert any((tmp_path / "given" / "checkpoints").iterdir()) and not (tmp_path / "from-env").exists()


def test_the_switch_interval_is_shortened_to_the_tuning_and_never_raised() -> None:
    saved = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        assert shorten_switch_interval(Tuning().switch_interval_ms) == pytest.approx(0.0005)
        sys.setswitchinterval(0.0001)  # someone set it lower: left alone
        assert shorten_switch_interval(Tuning().switch_interval_ms) == pytest.approx(0.0001)
        sys.setswitchinterval(0.005)
        tuning = Tuning.from_env({"OMNI_STREAM_SWITCH_INTERVAL_MS": "0"})
        assert shorten_switch_interval(tuning.switch_interval_ms) == pytest.approx(0.005)  # 0: leave it alone
        tuning = Tuning.from_env({"OMNI_STREAM_SWITCH_INTERVAL_MS": "2"})
        assert shorten_switch_interval(tuning.switch_interval_ms) == pytest.approx(0.002)
    finally:
        sys.setswitchinterval(saved)


def test_the_codec_stream_switch_picks_the_streams_priority() -> None:
    assert codec_stream_priority(Tuning().codec_stream) == -100  # high, measured the faster (run 24)
    assert codec_stream_priority(Tuning.from_env({"OMNI_STREAM_CODEC_STREAM": "normal"}).codec_stream) == 0
    assert codec_stream_priority(Tuning.from_env({"OMNI_STREAM_CODEC_STREAM": "off"}).codec_stream) is None


def test_the_decoder_kernel_switches_shape_the_cuda_kernel_set() -> None:
    """fused, small_rows, predictor_small_rows, predictor_kernel and pdl, as the families' runners get them on CUDA
    (built without a device: the set, not a launch)."""
    cuda = torch.device("cuda")
    assert fused.default_kernels(torch.device("cpu"), Tuning()) is None  # CPU: the module path, always
    assert fused.default_kernels(cuda, Tuning.from_env({"OMNI_STREAM_FUSED": "off"})) is None
    assert vocoder_kernels("cuda", Tuning(fused=False)) is None
    assert fused.TORCH.predictor_frame is False  # the CPU's torch functions never take the frame kernel
    pytest.importorskip("triton")
    from omni_stream.runtime import triton_kernels as tk

    kernels = fused.default_kernels(cuda, Tuning())
    assert kernels is not None and kernels.name == "triton" and kernels.add_rms_norm is tk.add_rms_norm
    assert (kernels.small_rows, kernels.predictor_rows, kernels.predictor_frame) == (16, None, False)
    env = {
        "OMNI_STREAM_SMALL_ROWS": "8",
        "OMNI_STREAM_PREDICTOR_SMALL_ROWS": "2",
        "OMNI_STREAM_PREDICTOR_KERNEL": "on",
        "OMNI_STREAM_PDL": "norm",
    }
    kernels = fused.default_kernels(cuda, Tuning.from_env(env))
    assert kernels is not None and kernels.small_rows == 8 and kernels.for_predictor().small_rows == 2
    assert kernels.predictor_frame is True
    bound = [kernels.add_rms_norm, kernels.qk_norm_rope, kernels.qk_norm_rope_kv, kernels.silu_mul, kernels.sample,
             kernels.decode_attention, kernels.small.linear, kernels.small.embed_linear]  # fmt: skip
    assert all(isinstance(f, functools.partial) and f.keywords == {"pdl": {"norm"}} for f in bound)
    assert not tk._pdl(torch.empty(1), "norm", frozenset({"norm"}))  # never off CUDA


def test_the_codec_switches_reach_the_vocoder_kernels() -> None:
    pytest.importorskip("triton")
    kernels = vocoder_kernels("cuda", replace(Tuning(), codec_phases=frozenset({9})))
    assert kernels is not None and kernels.phases == {9} and not kernels.channels_last
    kernels = vocoder_kernels("cuda", Tuning.from_env({"OMNI_STREAM_CODEC_CHANNELS_LAST": "off"}))
    assert kernels is not None and kernels.phases == {3, 9} and not kernels.channels_last


def test_serve_takes_the_api_key_and_the_voices_dir_from_the_tuning(tmp_path) -> None:
    import argparse

    from omni_stream.realtime.server import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    tuning = Tuning.from_env({"OMNI_STREAM_API_KEY": "k", "OMNI_STREAM_CACHE": str(tmp_path)})
    settings = settings_from_args(parser.parse_args([]), tuning)
    assert settings.api_key == "k" and settings.voices_dir == tmp_path / "voices"
    assert settings_from_args(parser.parse_args(["--api-key", "flag"]), tuning).api_key == "flag"


def test_the_device_policy_switches_reach_the_worker() -> None:
    from omni_stream.device_policy import DevicePolicy

    tuning = Tuning.from_env({"OMNI_STREAM_DEVICE_POLICY": "rounds", "OMNI_STREAM_THROUGHPUT_WAIT_MS": "80"})
    assert (tuning.device_policy, tuning.throughput_wait_ms, tuning.throughput_stream) == ("rounds", 80.0, True)
    policy = DevicePolicy.from_tuning(tuning)
    assert (policy.deadlines, policy.max_wait) == (False, 0.08)


# --- one place reads the environment; the README lists every switch -------------------------------------------

ALLOWED_READERS = {"omni_stream/runtime/settings.py"}


def _reads_environment(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            return True
        if isinstance(node, ast.Name) and node.id in ("environ", "getenv"):
            return True
    return False


def test_no_module_outside_the_settings_module_reads_the_environment() -> None:
    readers = []
    for folder in ("omni_stream", "realtime", "codecs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if _reads_environment(ast.parse(path.read_text(), rel)):
                readers.append(rel)
    assert set(readers) <= ALLOWED_READERS, sorted(set(readers) - ALLOWED_READERS)


def test_the_readme_lists_every_switch() -> None:
    table = (ROOT / "README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1) for m in re.finditer(r"^\| `(OMNI_STREAM_[A-Z_]+)", table, re.M)}
    assert {s.env for s in SWITCHES} <= rows, {s.env for s in SWITCHES} - rows
    for switch in SWITCHES:
        assert f"`{switch.name}`" in table, switch.name  # the field (and --tune name) beside its variable
