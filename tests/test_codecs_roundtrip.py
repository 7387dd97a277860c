"""Every output format round-trips through an independent decoder, streamed in random chunk sizes."""

from __future__ import annotations

import io
import warnings

import av
import numpy as np
import pytest
import soundfile as sf

from omni_stream.codecs import encode_whole, open_encoder
from omni_stream.codecs.pcm import to_int16
from omni_stream.codecs.testsignal import correlation, find_delay, random_splits, snr_db, speech_like
from omni_stream.codecs.wav import WAV_HEADER_BYTES

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

RATE = 24000
SIGNAL = speech_like(3.0, RATE, seed=7)


def stream(fmt: str, x: np.ndarray, rate: int = RATE, *, seed: int = 1, **kwargs) -> list[bytes]:
    enc = open_encoder(fmt, rate, x.shape[1] if x.ndim == 2 else 1, **kwargs)
    parts = [enc.encode(x[s]) for s in random_splits(len(x), seed=seed)]
    parts.append(enc.flush())
    return parts


def sf_read_int16(data: bytes) -> tuple[np.ndarray, int]:
    block, rate = sf.read(io.BytesIO(data), dtype="int16", always_2d=True)
    return block, rate


def av_read_int16(data: bytes) -> tuple[np.ndarray, int]:
    """Interleaved int16 ``(n, channels)`` through FFmpeg (libsndfile cannot read a FLAC stream of unknown length)."""
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(audio=0))
    assert all(f.format.name == "s16" for f in frames)
    channels = frames[0].layout.nb_channels
    return np.concatenate([f.to_ndarray().reshape(-1, channels) for f in frames]), frames[0].sample_rate


def av_read(data: bytes) -> tuple[np.ndarray, int]:
    """Mono samples and rate through FFmpeg's decoders."""
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(audio=0))
    assert all(f.layout.nb_channels == 1 for f in frames)
    # Integer formats come back as integers: the comparisons here only need shape and timing for those.
    return np.concatenate([f.to_ndarray()[0] for f in frames]).astype(np.float32), frames[0].sample_rate


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac"])
def test_lossless_formats_are_bit_exact_after_int16_quantization(fmt: str) -> None:
    data = b"".join(stream(fmt, SIGNAL))
    expected = to_int16(SIGNAL)
    if fmt == "pcm":
        decoded = np.frombuffer(data, dtype="<i2")
    else:
        block, rate = (av_read_int16 if fmt == "flac" else sf_read_int16)(data)
        assert rate == RATE
        decoded = block[:, 0]
    np.testing.assert_array_equal(decoded, expected)


@pytest.mark.parametrize(
    ("fmt", "min_snr_db", "min_corr"),
    [
        # Waveform fidelity of perceptual codecs on the 3 s test signal, measured after aligning by
        # cross-correlation: mp3 ~20 dB, opus ~14 dB, aac ~27 dB at the default bitrates.
        ("mp3", 14.0, 0.98),
        ("opus", 9.0, 0.95),
        ("aac", 20.0, 0.99),
    ],
)
def test_lossy_formats_match_after_alignment(fmt: str, min_snr_db: float, min_corr: float) -> None:
    data = b"".join(stream(fmt, SIGNAL))
    if fmt == "aac":
        decoded, rate = av_read(data)
    else:
        block, rate = sf_read_int16(data)
        decoded = block[:, 0].astype(np.float32) / 32768
    assert rate == RATE
    delay = find_delay(SIGNAL, decoded, max_delay=3000)
    assert len(decoded) >= len(SIGNAL) + delay - 1200  # nothing lost but the codec's final padding block
    n = min(len(SIGNAL), len(decoded) - delay) - 1200
    ref, out = SIGNAL[:n], decoded[delay : delay + n]
    assert snr_db(ref, out) > min_snr_db
    assert correlation(ref, out) > min_corr


@pytest.mark.parametrize(("fmt", "reference"), [("mulaw", audioop.lin2ulaw), ("alaw", audioop.lin2alaw)])
def test_g711_matches_audioop_and_stays_within_quantization_error(fmt: str, reference) -> None:
    x8k = speech_like(3.0, 8000, seed=3)
    data = b"".join(stream(fmt, x8k, 8000))
    pcm16 = to_int16(x8k)
    assert data == reference(pcm16.tobytes(), 2)
    back = np.frombuffer((audioop.ulaw2lin if fmt == "mulaw" else audioop.alaw2lin)(data, 2), dtype="<i2")
    # G.711 steps are 1/16 of each segment: the error stays under ~3.2% of the magnitude (plus the finest step).
    err = np.abs(back.astype(np.int32) - pcm16.astype(np.int32))
    assert np.all(err <= np.abs(pcm16.astype(np.int32)) / 31 + 16)


@pytest.mark.parametrize("fmt", ["mulaw", "alaw"])
def test_g711_resamples_24k_input_to_8k(fmt: str) -> None:
    enc = open_encoder(fmt, RATE)
    assert enc.sample_rate == 8000
    data = b"".join(stream(fmt, SIGNAL))
    assert len(data) == len(SIGNAL) // 3
    decode = audioop.ulaw2lin if fmt == "mulaw" else audioop.alaw2lin
    back = np.frombuffer(decode(data, 2), dtype="<i2").astype(np.float32) / 32768
    ref = speech_like(3.0, RATE, seed=7)[::3]  # the test signal has no energy above 4 kHz worth aliasing
    # The noise bursts reach above 4 kHz, which the 8 kHz stream rightly drops.
    assert correlation(ref[200:-200], back[200:-200]) > 0.98


# Opus differs only in the Ogg serial number (random per stream); FLAC in the header's length and MD5.
@pytest.mark.parametrize("fmt", ["pcm", "mulaw", "alaw", "mp3", "aac"])
def test_streamed_bytes_equal_non_streamed_encoding(fmt: str) -> None:
    rate = 8000 if fmt in ("mulaw", "alaw") else RATE
    x = speech_like(3.0, rate, seed=7)
    assert b"".join(stream(fmt, x, rate)) == encode_whole(fmt, x, rate)


def test_streamed_wav_has_unknown_sizes_and_the_whole_file_has_exact_ones() -> None:
    parts = stream("wav", SIGNAL)
    data = b"".join(parts)
    whole = encode_whole("wav", SIGNAL, RATE)
    assert parts[0][:4] == b"RIFF" and len(parts[0]) >= WAV_HEADER_BYTES
    assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    assert int.from_bytes(whole[4:8], "little") == len(whole) - 8
    assert int.from_bytes(whole[40:44], "little") == 2 * len(SIGNAL)
    assert data[WAV_HEADER_BYTES:] == whole[WAV_HEADER_BYTES:]
    info = sf.info(io.BytesIO(whole))
    assert (info.samplerate, info.channels, info.frames) == (RATE, 1, len(SIGNAL))


def test_streamed_flac_decodes_to_the_same_samples_as_the_whole_file() -> None:
    streamed, _ = av_read_int16(b"".join(stream("flac", SIGNAL)))
    whole = encode_whole("flac", SIGNAL, RATE)
    info = sf.info(io.BytesIO(whole))
    assert info.frames == len(SIGNAL)  # the non-streamed header states the length
    np.testing.assert_array_equal(streamed, sf.read(io.BytesIO(whole), dtype="int16", always_2d=True)[0])


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_concatenated_chunks_form_one_stream_like_the_whole_encoding(fmt: str) -> None:
    streamed, rate = av_read(b"".join(stream(fmt, SIGNAL)))
    whole, whole_rate = av_read(encode_whole(fmt, SIGNAL, RATE))
    assert rate == whole_rate
    assert abs(len(streamed) - len(whole)) == 0
    assert len(streamed) >= len(SIGNAL) * rate // RATE


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3", "opus", "aac", "mulaw", "alaw"])
def test_stereo_and_int16_input_are_accepted(fmt: str) -> None:
    stereo = np.stack([SIGNAL[:12000], -SIGNAL[:12000]], axis=1)
    data = b"".join(stream(fmt, to_int16(stereo)))
    assert data
    if fmt in ("wav", "flac"):
        block, _ = (av_read_int16 if fmt == "flac" else sf_read_int16)(data)
        np.testing.assert_array_equal(block, to_int16(stereo))
    elif fmt == "pcm":
        np.testing.assert_array_equal(np.frombuffer(data, dtype="<i2").reshape(-1, 2), to_int16(stereo))


def test_opus_resamples_unsupported_rates() -> None:
    x = speech_like(2.0, 22050, seed=2)
    enc = open_encoder("opus", 22050)
    assert enc.sample_rate == 24000
    block, rate = sf_read_int16(b"".join(stream("opus", x, 22050)))
    assert rate == 24000
    assert abs(len(block) - 2.0 * 24000) <= 480
