"""Whisper log-mel features of an 8 s window at 16 kHz, as Smart Turn v3 reads them (80 mels x 800 frames).

The same computation as ``transformers``' ``WhisperFeatureExtractor`` with ``chunk_length=8`` and
``do_normalize=True`` (what the model was trained on): the window is the audio's last 8 s, zero-padded at the
front when shorter (the model sees silence before short turns, as in training); the waveform is normalized to
zero mean and unit variance; a centred 400-point STFT (periodic Hann window, hop 160, reflect padding) gives power
spectra; a Slaney mel filterbank (0-8 kHz, 80 filters) and ``log10`` with a floor of 1e-10 follow; the last frame
is dropped; values are clamped to 8 below the maximum and mapped by ``(x + 4) / 4``. Pure numpy, float64 inside,
float32 out; a batch of windows is computed in one pass. :class:`LogMelTorch` is the same arithmetic with torch
on any device (float64 inside), for a model whose graph runs there.
"""

from __future__ import annotations

import numpy as np
import torch

SAMPLE_RATE = 16000
WINDOW_SECONDS = 8
WINDOW = SAMPLE_RATE * WINDOW_SECONDS  # 128000 samples
N_FFT = 400
HOP = 160
N_MELS = 80
FRAMES = WINDOW // HOP  # 800
_NORM_EPS = 1e-7
_MEL_FLOOR = 1e-10


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, np.float64)
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * 27.0 / np.log(6.4))


def _mel_to_hz(mel: np.ndarray | float) -> np.ndarray:
    mel = np.asarray(mel, np.float64)
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0))


def mel_filters() -> np.ndarray:
    """``[N_MELS, N_FFT // 2 + 1]`` triangular filters with Slaney area normalization."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), N_MELS + 2))
    bins = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    rise = (bins[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    fall = (edges[2:, None] - bins[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    weights = np.maximum(0.0, np.minimum(rise, fall))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


_FILTERS = mel_filters()
_HANN = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic


def last_window(audio: np.ndarray) -> np.ndarray:
    """The last ``WINDOW`` samples of ``audio`` (16 kHz mono), zero-padded at the front when shorter (float32)."""
    x = np.asarray(audio, np.float32).reshape(-1)[-WINDOW:]
    if x.size < WINDOW:
        x = np.concatenate((np.zeros(WINDOW - x.size, np.float32), x))
    return x


def log_mel(windows: np.ndarray) -> np.ndarray:
    """``[n, WINDOW]`` float32 windows -> ``[n, N_MELS, FRAMES]`` float32 features (see module docstring)."""
    x = np.asarray(windows, np.float32)
    if x.ndim != 2 or x.shape[1] != WINDOW:
        raise ValueError(f"windows must be [n, {WINDOW}], got {x.shape}")
    # Normalized in float32, as the reference extractor does before its spectrogram promotes to float64.
    x = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + _NORM_EPS)
    pad = N_FFT // 2
    padded = np.pad(x.astype(np.float64), ((0, 0), (pad, pad)), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT, axis=1)[:, ::HOP]  # [n, FRAMES + 1, N_FFT]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # [n, FRAMES + 1, bins]
    mel = np.log10(np.maximum(_MEL_FLOOR, power @ _FILTERS.T))[:, :-1].transpose(0, 2, 1)  # [n, mels, FRAMES]
    mel = np.maximum(mel, mel.max(axis=(1, 2), keepdims=True) - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


class LogMelTorch:
    """:func:`log_mel` with torch on ``device``: ``[n, WINDOW]`` float32 -> ``[n, N_MELS, FRAMES]`` float32, float64
    inside. Its window and filters are placed once, so a call makes no host-to-device copy (a CUDA graph can hold
    it)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.hann = torch.as_tensor(_HANN, dtype=torch.float64).to(device)
        self.filters = torch.as_tensor(_FILTERS.T.copy(), dtype=torch.float64).to(device)

    def __call__(self, windows: torch.Tensor) -> torch.Tensor:
        if windows.dim() != 2 or windows.shape[1] != WINDOW:
            raise ValueError(f"windows must be [n, {WINDOW}], got {tuple(windows.shape)}")
        x = windows.float()
        mean = x.mean(dim=1, keepdim=True)
        x = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(dim=1, keepdim=True) + _NORM_EPS)
        pad = N_FFT // 2
        padded = torch.nn.functional.pad(x.double()[:, None], (pad, pad), mode="reflect")[:, 0]
        frames = padded.unfold(1, N_FFT, HOP)  # [n, FRAMES + 1, N_FFT]
        power = torch.fft.rfft(frames * self.hann, dim=-1).abs() ** 2
        mel = torch.log10(torch.clamp(power @ self.filters, min=_MEL_FLOOR))[:, :-1].transpose(1, 2)
        mel = torch.maximum(mel, mel.amax(dim=(1, 2), keepdim=True) - 8.0)
        return ((mel + 4.0) / 4.0).float()
