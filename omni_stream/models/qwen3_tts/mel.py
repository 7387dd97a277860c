"""Log-mel front end of the speaker encoder (24 kHz, slaney mel), in pure torch."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

# Speaker-encoder front end (QWEN3_TTS.md section 1.8)
SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
WIN = 1024
N_MELS = 128
FMIN = 0.0
FMAX = 12000.0


def hz_to_mel_slaney(hz: Tensor) -> Tensor:
    """Slaney mel scale: linear (200/3 Hz per mel) below 1 kHz, logarithmic above."""
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = math.log(6.4) / 27.0
    linear = hz / f_sp
    log = min_log_mel + torch.log(torch.clamp(hz, min=min_log_hz) / min_log_hz) / logstep
    return torch.where(hz >= min_log_hz, log, linear)


def mel_to_hz_slaney(mel: Tensor) -> Tensor:
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = math.log(6.4) / 27.0
    linear = f_sp * mel
    log = min_log_hz * torch.exp(logstep * (mel - min_log_mel))
    return torch.where(mel >= min_log_mel, log, linear)


@lru_cache(maxsize=8)
def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> Tensor:
    """``[n_mels, n_fft // 2 + 1]`` float32 triangular filters with slaney area normalization (librosa defaults)."""
    dtype = torch.float64  # built in double and rounded once, as librosa does
    fft_freqs = torch.linspace(0, sr / 2, 1 + n_fft // 2, dtype=dtype)
    lo, hi = hz_to_mel_slaney(torch.tensor([fmin, fmax], dtype=dtype))
    mel_f = mel_to_hz_slaney(torch.linspace(float(lo), float(hi), n_mels + 2, dtype=dtype))
    fdiff = mel_f[1:] - mel_f[:-1]
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.to(torch.float32)


def log_mel_spectrogram(
    audio: Tensor,
    *,
    sample_rate: int = SAMPLE_RATE,
    n_fft: int = N_FFT,
    hop: int = HOP,
    win: int = WIN,
    n_mels: int = N_MELS,
    fmin: float = FMIN,
    fmax: float = FMAX,
) -> Tensor:
    """float32 audio ``[T]`` or ``[B, T]`` -> natural-log mel ``[B, n_mels, frames]`` (reflect pad, no centering)."""
    if audio.dim() == 1:
        audio = audio[None]
    audio = audio.float()
    pad = (n_fft - hop) // 2
    audio = F.pad(audio[:, None], (pad, pad), mode="reflect")[:, 0]
    window = torch.hann_window(win, device=audio.device)
    spec = torch.stft(
        audio, n_fft, hop_length=hop, win_length=win, window=window, center=False, onesided=True, return_complex=True
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = slaney_mel_filterbank(sample_rate, n_fft, n_mels, fmin, fmax).to(audio.device) @ magnitude
    return torch.log(torch.clamp(mel, min=1e-5))
