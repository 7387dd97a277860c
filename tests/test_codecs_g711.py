"""G.711 tables agree with CPython's audioop on every 16-bit input and with hand-checked code points."""

from __future__ import annotations

import warnings

import numpy as np

from omni_stream.codecs import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = bytes(range(256))


def test_ulaw_encoding_matches_audioop_for_every_sample() -> None:
    assert ulaw_encode(ALL_INT16).tobytes() == audioop.lin2ulaw(ALL_INT16.tobytes(), 2)


def test_alaw_encoding_matches_audioop_for_every_sample() -> None:
    assert alaw_encode(ALL_INT16).tobytes() == audioop.lin2alaw(ALL_INT16.tobytes(), 2)


def test_decoding_matches_audioop_for_every_code() -> None:
    assert ulaw_decode(ALL_CODES).tobytes() == audioop.ulaw2lin(ALL_CODES, 2)
    assert alaw_decode(ALL_CODES).tobytes() == audioop.alaw2lin(ALL_CODES, 2)


def test_hand_checked_code_points() -> None:
    # mu-law: zero is 0xFF, full scale 0x80 / 0x00, -1 (|x| + bias 33 = 34, segment 0, step 1) is 0x7E;
    # a-law: zero 0xD5 (even bits inverted), full scale 0xAA / 0x2A, -1 is 0x55.
    x = np.array([0, 32767, -32768, -1], dtype=np.int16)
    assert ulaw_encode(x).tolist() == [0xFF, 0x80, 0x00, 0x7E]
    assert alaw_encode(x).tolist() == [0xD5, 0xAA, 0x2A, 0x55]
    assert ulaw_decode(bytes([0xFF, 0x80, 0x00])).tolist() == [0, 32124, -32124]
    assert alaw_decode(bytes([0xD5, 0xAA, 0x2A])).tolist() == [8, 32256, -32256]


def test_round_trip_error_is_within_one_quantization_step() -> None:
    x = ALL_INT16.astype(np.int32)
    for enc, dec in [(ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)]:
        err = np.abs(dec(enc(ALL_INT16)).astype(np.int32) - x)
        # Steps double per segment: the error is under 1/32 of the magnitude, plus the finest step near zero;
        # near full scale the codes clip at +-32124 (mu-law) / +-32256 (a-law).
        assert np.all(err[np.abs(x) < 32000] <= np.abs(x[np.abs(x) < 32000]) / 31 + 16)
        assert err.max() <= 1024
