"""The Snake activation of a vocoder joined with its convolution's left context, as one Triton kernel.

A vocoder's residual units run ``conv(snake(x))`` at the audio rate, and a streaming causal convolution first
concatenates its history with its new input. Eagerly that is six passes over the activation per convolution
(multiply, sine, square, multiply, add, then the concatenation); here one kernel reads ``x`` once and writes
``[history | snake(x)]`` once, the buffer the convolution reads. The arithmetic is fp32, rounded once to the
activation dtype (eager bf16 rounds after every operation, so the two differ by about one bf16 unit).
:func:`omni_stream.models.qwen3_tts.codec.snake_cat` is the torch version this is tested against
(``TRITON_INTERPRET=1`` runs it on the CPU in the suite).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _snake_cat_kernel(
    x_ptr, h_ptr, p_ptr, out_ptr, channels, n, hist, x_sb, x_sc, h_sb, h_sc,
    HAS_HIST: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # b * channels + c
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    b = (row // channels).to(tl.int64)
    c = row % channels
    width = hist + n
    alpha = tl.load(p_ptr + c).to(tl.float32)
    inv_beta = tl.load(p_ptr + channels + c).to(tl.float32)
    new = (t >= hist) & (t < width)
    x = tl.load(x_ptr + b * x_sb + c * x_sc + (t - hist), mask=new, other=0.0).to(tl.float32)
    s = tl.sin(x * alpha)
    y = x + inv_beta * (s * s)
    old = t < hist
    if HAS_HIST:
        h = tl.load(h_ptr + b * h_sb + c * h_sc + t, mask=old, other=0.0).to(tl.float32)
        y = tl.where(old, h, y)
    else:
        y = tl.where(old, 0.0, y)
    tl.store(out_ptr + row.to(tl.int64) * width + t, y.to(out_ptr.dtype.element_ty), mask=t < width)


def snake_cat(x: torch.Tensor, params: torch.Tensor, history: torch.Tensor | None, pad: int = 0) -> torch.Tensor:
    """``[history | snake(x)]`` along the last axis (``history`` None: ``pad`` zero columns instead).

    ``x [B, C, n]`` and ``history [B, C, h]`` may be strided views with unit stride along time; ``params [2, C, 1]``
    holds ``exp(alpha)`` and ``1 / (exp(beta) + 1e-9)``. Returns a new contiguous ``[B, C, h + n]``.
    """
    b, c, n = x.shape
    if x.stride(2) != 1:
        x = x.contiguous()
    h = pad
    if history is not None:
        if history.stride(2) != 1:
            history = history.contiguous()
        h = history.shape[2]
    out = torch.empty((b, c, h + n), dtype=x.dtype, device=x.device)
    hist = history if history is not None else x  # any pointer: never read without a history
    grid = (b * c, triton.cdiv(h + n, BLOCK))
    _snake_cat_kernel[grid](
        x, hist, params.contiguous(), out, c, n, h, x.stride(0), x.stride(1), hist.stride(0), hist.stride(1),
        HAS_HIST=history is not None, BLOCK=BLOCK,
    )  # fmt: skip
    return out
