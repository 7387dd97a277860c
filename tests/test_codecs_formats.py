"""Format registry, encoder options and encoder state."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

from omni_stream import codecs
from omni_stream.codecs import (
    FORMATS,
    CodecError,
    EncoderState,
    UnsupportedFormatError,
    encode_whole,
    extension,
    mime_type,
    open_encoder,
)

ALL = ["pcm", "wav", "flac", "mp3", "opus", "aac", "mulaw", "alaw"]


def test_every_format_has_a_mime_type_and_extension() -> None:
    assert sorted(FORMATS) == sorted(ALL)
    assert mime_type("wav") == "audio/wav"
    assert mime_type("MP3") == "audio/mpeg"
    assert mime_type("opus") == "audio/ogg"
    assert mime_type("pcm") == "audio/pcm"
    assert mime_type("flac") == "audio/flac"
    assert mime_type("aac") == "audio/aac"
    assert mime_type("mulaw") == "audio/basic"
    assert extension("opus") == ".opus"
    for fmt in ALL:
        assert mime_type(fmt).startswith("audio/")
        assert extension(fmt).startswith(".")
        enc = open_encoder(fmt, 24000)
        assert (enc.mime_type, enc.extension) == (mime_type(fmt), extension(fmt))
        enc.close()


def test_unknown_format_names_the_choices() -> None:
    with pytest.raises(UnsupportedFormatError, match="expected one of pcm, wav"):
        open_encoder("ogg-vorbis", 24000)
    with pytest.raises(ValueError):  # errors are ValueErrors for callers that do not import the package's types
        mime_type("m4a")


@pytest.mark.parametrize(
    ("fmt", "rate", "coded"),
    [("opus", 24000, 24000), ("opus", 22050, 24000), ("opus", 44100, 48000), ("mp3", 23000, 24000),
     ("aac", 24000, 24000), ("mulaw", 16000, 8000), ("wav", 22050, 22050), ("flac", 44100, 44100)],
)  # fmt: skip
def test_coding_rate(fmt: str, rate: int, coded: int) -> None:
    with open_encoder(fmt, rate) as enc:
        assert enc.sample_rate == coded and enc.input_rate == rate


def test_bad_options_raise_codec_errors() -> None:
    with pytest.raises(UnsupportedFormatError, match="channels"):
        open_encoder("mp3", 24000, channels=3)
    with pytest.raises(UnsupportedFormatError, match="sample_rate"):
        open_encoder("wav", 100)
    with pytest.raises(CodecError):
        open_encoder("opus", 24000, channels=0)
    # Settings the codec itself refuses fail at open, not in the middle of a stream.
    with pytest.raises(UnsupportedFormatError, match="opus encoder rejected"):
        open_encoder("opus", 24000, bitrate=1_000_000)


def test_bad_chunks_are_rejected() -> None:
    enc = open_encoder("pcm", 24000, channels=2)
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        enc.encode(np.zeros(10, dtype=np.float32))
    with pytest.raises(TypeError, match="dtype"):
        enc.encode(np.zeros((10, 2), dtype=np.int32))


def test_float_input_is_clipped_and_rounded() -> None:
    x = np.array([0.0, 0.5, 1.0, 2.0, -1.0, -3.0, 1e-5, np.nan, np.inf], dtype=np.float32)
    data = encode_whole("pcm", x, 24000)
    assert np.frombuffer(data, dtype="<i2").tolist() == [0, 16384, 32767, 32767, -32767, -32767, 0, 0, 32767]


def test_bitrate_is_honoured() -> None:
    x = np.zeros(24000, dtype=np.float32)
    x[::50] = 0.5
    low, high = (len(encode_whole("mp3", x, 24000, bitrate=b)) for b in (32_000, 128_000))
    assert 3 * low < high


@pytest.mark.parametrize("fmt", ALL)
def test_encoder_state_is_explicit(fmt: str) -> None:
    enc = open_encoder(fmt, 24000)
    enc.encode(np.zeros(4800, dtype=np.float32))
    enc.flush()
    assert enc.state is EncoderState.FINISHED
    with pytest.raises(ValueError, match='Cannot call "encode" once the encoder is finished'):
        enc.encode(np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match="flush"):
        enc.flush()
    enc.close()  # idempotent after flush
    other = open_encoder(fmt, 24000)
    other.encode(np.zeros(100, dtype=np.float32))
    other.close()
    assert other.state is EncoderState.CLOSED


@pytest.mark.parametrize("fmt", ALL)
def test_empty_stream_flushes_cleanly(fmt: str) -> None:
    assert isinstance(open_encoder(fmt, 24000).flush(), bytes)


def test_non_streamed_encoders_return_everything_from_flush() -> None:
    for fmt in ALL:
        enc = open_encoder(fmt, 24000, streaming=False)
        assert enc.encode(np.zeros(24000, dtype=np.float32)) == b""
        assert enc.flush()


def test_package_imports_nothing_else_from_omni_stream() -> None:
    root = pathlib.Path(codecs.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not (node.module or "").startswith("omni_stream"), path
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                raise AssertionError(f"{path} imports above the package")
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("omni_stream") for a in node.names), path
