"""decode_audio: every upload container decodes from memory; bad input raises AudioDecodeError, never worse."""

from __future__ import annotations

import io
import time
import tracemalloc
from fractions import Fraction

import av
import numpy as np
import pytest
import soundfile as sf

from omni_stream.codecs import AudioDecodeError, decode_audio, encode_whole, resample, sniff_container
from omni_stream.codecs import decode as decode_module
from omni_stream.codecs.testsignal import correlation, find_delay, speech_like

RATE = 24000
SIGNAL = speech_like(3.0, RATE, seed=21)


def sf_file(x: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def av_file(x: np.ndarray, rate: int, container: str, codec: str, sample_format: str = "flt") -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.codec_context.layout = "mono"
        stream.codec_context.format = sample_format
        frame = av.AudioFrame.from_ndarray(x[None, :].copy(), format=sample_format, layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def id3_tagged(mp3: bytes) -> bytes:
    body = b"TIT2\x00\x00\x00\x05\x00\x00\x03abc\x00"
    size = len(body)
    syncsafe = bytes([(size >> 21) & 0x7F, (size >> 14) & 0x7F, (size >> 7) & 0x7F, size & 0x7F])
    return b"ID3\x04\x00\x00" + syncsafe + body + mp3


@pytest.fixture(scope="module")
def uploads() -> dict[str, bytes]:
    x48 = resample(SIGNAL, RATE, 48000)
    stereo = np.stack([SIGNAL, 0.5 * SIGNAL], axis=1)
    mp3 = encode_whole("mp3", SIGNAL, RATE)
    return {
        "wav": encode_whole("wav", SIGNAL, RATE),
        "wav-float-stereo-44k": sf_file(resample(stereo, RATE, 44100), 44100, "WAV", "FLOAT"),
        "flac": sf_file(SIGNAL, RATE, "FLAC"),
        "ogg-vorbis": sf_file(SIGNAL, RATE, "OGG", "VORBIS"),
        "ogg-opus": encode_whole("opus", SIGNAL, RATE),
        "mp3": mp3,
        "mp3-id3": id3_tagged(mp3),
        "webm-opus": av_file(x48, 48000, "webm", "libopus"),
        "mp4-aac": av_file(SIGNAL, RATE, "mp4", "aac", "fltp"),
        "aac-adts": encode_whole("aac", SIGNAL, RATE),
    }


KINDS = [
    "wav",
    "wav-float-stereo-44k",
    "flac",
    "ogg-vorbis",
    "ogg-opus",
    "mp3",
    "mp3-id3",
    "webm-opus",
    "mp4-aac",
    "aac-adts",
]


@pytest.mark.parametrize("kind", KINDS)
def test_decodes_every_upload_container_to_mono_at_the_target_rate(uploads: dict[str, bytes], kind: str) -> None:
    audio, duration = decode_audio(uploads[kind], 16000, max_seconds=30)
    assert audio.dtype == np.float32 and audio.ndim == 1
    # Lossy codecs add up to ~1-2 frames of priming and padding.
    assert 3.0 <= duration < 3.2
    assert abs(len(audio) - duration * 16000) <= 1
    ref = resample(SIGNAL, RATE, 16000)
    if kind == "wav-float-stereo-44k":
        ref = 0.75 * ref  # mean of the two channels
    delay = find_delay(ref, audio, max_delay=1200)
    n = len(ref) - 1600
    assert correlation(ref[:n], audio[delay : delay + n]) > 0.95
    assert abs(np.std(audio[delay : delay + n]) / np.std(ref[:n]) - 1) < 0.15


def test_lossless_upload_decodes_to_the_exact_samples() -> None:
    pcm16 = np.rint(SIGNAL * 32767).astype(np.int16)
    audio, duration = decode_audio(sf_file(pcm16, RATE, "FLAC"), RATE)
    assert duration == 3.0
    np.testing.assert_array_equal(audio, pcm16.astype(np.float32) / 32768)


def test_sniffs_containers_by_magic_bytes(uploads: dict[str, bytes]) -> None:
    expected = {"wav": "wav", "flac": "flac", "ogg-vorbis": "ogg", "mp3": "mp3", "mp3-id3": "mp3"}
    expected |= {"webm-opus": "matroska", "mp4-aac": "mp4", "aac-adts": "aac"}
    for kind, name in expected.items():
        assert sniff_container(uploads[kind]) == name
    # Playlists and other FFmpeg-probeable text never reach a demuxer that opens other files.
    assert sniff_container(b"#EXTM3U\n#EXT-X-VERSION:3\nfile:///etc/passwd\n") is None
    assert sniff_container(b"ffconcat version 1.0\nfile /etc/passwd\n") is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"hello, this is not audio at all", "not a recognised audio file"),
        (b"\x89PNG\r\n\x1a\n" + bytes(200), "not a recognised audio file"),
        (b'{"audio": "base64..."}', "not a recognised audio file"),
        (b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(100), "wav"),
        (b"fLaC" + bytes(range(256)) * 4, "flac"),
        (b"OggS" + bytes(300), "ogg"),
        (b"\x1a\x45\xdf\xa3" + bytes(300), "matroska"),
        (b"\x00\x00\x00\x18ftypmp42" + bytes(300), "mp4"),
        (b"\xff\xfb\x90\x00" + bytes(10), "mp3"),
    ],
)
def test_non_audio_and_corrupt_uploads_raise_the_typed_error(data: bytes, message: str) -> None:
    with pytest.raises(AudioDecodeError, match=message):
        decode_audio(data, 16000)


@pytest.mark.parametrize("kind", ["wav", "flac", "ogg-vorbis", "ogg-opus", "mp4-aac", "aac-adts"])
@pytest.mark.parametrize("keep", [0.02, 0.5, 0.97])
def test_truncated_uploads_raise_the_typed_error(uploads: dict[str, bytes], kind: str, keep: float) -> None:
    data = uploads[kind]
    with pytest.raises(AudioDecodeError):
        decode_audio(data[: int(len(data) * keep)], 16000)


def test_mp3_cut_short_decodes_its_whole_frames(uploads: dict[str, bytes]) -> None:
    # MP3 states no length, so a cut one is still valid audio up to its last whole frame.
    audio, duration = decode_audio(uploads["mp3"][: len(uploads["mp3"]) // 2], 16000)
    assert 1.0 < duration < 2.0 and len(audio) > 16000


def test_over_length_audio_is_rejected(uploads: dict[str, bytes]) -> None:
    with pytest.raises(AudioDecodeError, match=r"longer than 2\.5 s"):
        decode_audio(uploads["wav"], 16000, max_seconds=2.5)
    decode_audio(uploads["wav"], 16000, max_seconds=3.0)


def test_absurd_sample_rates_are_rejected() -> None:
    wav = bytearray(encode_whole("wav", SIGNAL[:2400], RATE))
    wav[24:28] = (10).to_bytes(4, "little")  # 10 Hz
    wav[28:32] = (20).to_bytes(4, "little")
    with pytest.raises(AudioDecodeError, match="sample rate"):
        decode_audio(bytes(wav), 16000)


def test_non_finite_samples_are_rejected() -> None:
    x = SIGNAL[:2400].copy()
    x[100] = np.nan
    with pytest.raises(AudioDecodeError, match="non-finite"):
        decode_audio(sf_file(x, RATE, "WAV", "FLOAT"), 16000)
    x[100] = 1e30
    with pytest.raises(AudioDecodeError, match="out-of-range"):
        decode_audio(sf_file(x, RATE, "WAV", "FLOAT"), 16000)


def test_compression_bomb_stops_at_the_limit_with_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ten minutes of silence compress to a few kB of FLAC; decoding stops once past the limit.
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=48000, channels=1, format="FLAC") as f:
        block = np.zeros(480_000, dtype=np.int16)
        for _ in range(60):
            f.write(block)
    bomb = buf.getvalue()
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(AudioDecodeError, match="longer than 20 s"):
            decode_audio(bomb, 24000, max_seconds=20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # ~20 s at 24 kHz is 2 MB of float32; nothing near ten minutes' worth
    monkeypatch.setattr(decode_module, "MAX_DECODE_SECONDS", 5.0)
    with pytest.raises(AudioDecodeError, match="longer than 5 s"):
        decode_audio(bomb, 24000)


def test_accepts_bytearray_and_memoryview(uploads: dict[str, bytes]) -> None:
    a, _ = decode_audio(bytearray(uploads["wav"]), 8000)
    b, _ = decode_audio(memoryview(uploads["wav"]), 8000)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError):
        decode_audio("not bytes", 8000)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target_rate") as info:
        decode_audio(uploads["wav"], 0)
    assert not isinstance(info.value, AudioDecodeError)  # a caller's mistake, not a bad upload


def check_survives(data: bytes) -> None:
    try:
        audio, duration = decode_audio(data, 16000, max_seconds=10)
    except AudioDecodeError:
        return
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert 0 < duration <= 10 and np.isfinite(audio).all()


@pytest.mark.timeout(120)
def test_fuzz_random_bytes_never_crash_or_hang() -> None:
    rng = np.random.default_rng(1234)
    magics = [b"", b"RIFF\x00\x10\x00\x00WAVE", b"fLaC", b"OggS", b"\x1a\x45\xdf\xa3", b"\x00\x00\x00\x20ftyp"]
    magics += [b"\xff\xfb", b"\xff\xf1", b"ID3\x03\x00\x00\x00\x00\x00\x00\xff\xfb"]
    start = time.monotonic()
    for i in range(400):
        body = rng.integers(0, 256, size=int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
        check_survives(magics[i % len(magics)] + body)
    assert time.monotonic() - start < 60


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", KINDS)
def test_fuzz_mutated_valid_files_never_crash_or_hang(uploads: dict[str, bytes], kind: str) -> None:
    rng = np.random.default_rng(sum(kind.encode()))
    original = np.frombuffer(uploads[kind], dtype=np.uint8)
    start = time.monotonic()
    for _ in range(30):
        data = original.copy()
        how = rng.integers(0, 3)
        if how == 0:  # flip bytes, mostly in the headers where parsers branch
            span = min(len(data), 512 if rng.random() < 0.7 else len(data))
            idx = rng.integers(0, span, size=int(rng.integers(1, 16)))
            data[idx] = rng.integers(0, 256, size=len(idx), dtype=np.uint8)
        elif how == 1:  # cut anywhere
            data = data[: int(rng.integers(1, len(data)))]
        else:  # splice random bytes into the middle
            at = int(rng.integers(0, len(data)))
            data = np.concatenate([data[:at], rng.integers(0, 256, size=64, dtype=np.uint8), data[at:]])
        check_survives(data.tobytes())
    assert time.monotonic() - start < 60
