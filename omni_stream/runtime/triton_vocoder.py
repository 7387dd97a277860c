"""A vocoder's audio-rate elementwise work as Triton kernels: Snake activations, biases, residual sums, the
one-channel output convolution.

A vocoder's residual unit is ``x + conv2(snake(conv1(snake(x))))`` at the audio rate, and a streaming causal
convolution first concatenates its history with its new input. Eagerly every step is its own pass over the
activation: the Snake's multiply, sine, square, multiply and add, the concatenation, each convolution's bias
(added by a broadcasting kernel after cuDNN's), the residual sum. Here

    [history | snake(x + bias)]     one pass (:func:`snake_cat`): the buffer the next convolution reads
    h + bias + x                    one pass (:func:`residual_add`): a residual unit's output
    conv(x) to one channel          one kernel (:func:`conv_to_one`), its bias included: the waveform out

and the convolutions around them run without their bias. A window of 128 streams x 25 frames took 212 ms of
H200 time module by module and 118 ms so (``benchmarks/results/tts_bench.md``, run 23; ``codec_decoder.py``).
The arithmetic is fp32, rounded once to the activation dtype (eager bf16 rounds after every operation, so the
two differ by about one bf16 unit).
:data:`omni_stream.models.qwen3_tts.codec.TORCH_VOCODER` holds the torch versions these are tested against
(``TRITON_INTERPRET=1`` runs them on the CPU in the suite).

Activations lie time-major per channel (``[B, C, n]`` contiguous, the module path's layout) or, with
``OMNI_STREAM_CODEC_CHANNELS_LAST``, channel-major per time step (``[B, n, C]`` in memory, the layout cuDNN's
tensor-core kernels read and write; :mod:`omni_stream.runtime.layout`). Each function serves both: a
channel-major input goes to a twin kernel whose tiles hold up to 64 channels (the contiguous axis) at each of
their samples, and the output keeps the input's layout. The vocoder's convolutions keep a channel-major input so
(:func:`omni_stream.runtime.layout.conv1d`). Around a dilated convolution computed over its input's phases, the
channel-major Snake pass writes those phases (:func:`snake_split`) and the next one reads the convolution's output
in phase order (:class:`~omni_stream.runtime.layout.Phases`), so no pass copies them out and back (a 128 x 25
window 83.5 -> 67.1 ms on the H200, run 25).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from omni_stream.runtime.layout import Phases, channels_last, empty_like_layout, to_phases

BLOCK = 1024
CONV_BLOCK = 512
WIDE = 64  # channels of a channel-major tile, at most


@triton.jit
def _snake_cat_kernel(
    x_ptr, h_ptr, p_ptr, bias_ptr, out_ptr, channels, n, hist, x_sb, x_sc, h_sb, h_sc,
    HAS_HIST: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
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
    if HAS_BIAS:
        x += tl.load(bias_ptr + c).to(tl.float32)
    s = tl.sin(x * alpha)
    y = x + inv_beta * (s * s)
    old = t < hist
    if HAS_HIST:
        h = tl.load(h_ptr + b * h_sb + c * h_sc + t, mask=old, other=0.0).to(tl.float32)
        y = tl.where(old, h, y)
    else:
        y = tl.where(old, 0.0, y)
    tl.store(out_ptr + row.to(tl.int64) * width + t, y.to(out_ptr.dtype.element_ty), mask=t < width)


def _unit_time_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(2) == 1 else t.contiguous()


def snake_cat(
    x: torch.Tensor | Phases,
    params: torch.Tensor,
    history: torch.Tensor | None,
    pad: int = 0,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[history | snake(x + bias)]`` along the last axis (``history`` None: ``pad`` zero columns instead).

    ``x [B, C, n]`` and ``history [B, C, h]`` may be strided views; ``x`` held as its phases (a dilated
    convolution's output, :class:`~omni_stream.runtime.layout.Phases`) is read in place when channel-major;
    ``params [2, C, 1]`` holds ``exp(alpha)`` and ``1 / (exp(beta) + 1e-9)``; ``bias [C]`` (None: none). Returns
    a new ``[B, C, h + n]``, contiguous, or channel-major when ``x`` is.
    """
    if isinstance(x, Phases) and not channels_last(x.data):
        x = x.joined()
    if isinstance(x, Phases) or channels_last(x):
        return _snake_cat_channels_last(x, params, history, pad, bias)[0]
    x = _unit_time_stride(x)
    b, c, n = x.shape
    h = pad
    if history is not None:
        history = _unit_time_stride(history)
        h = history.shape[2]
    out = torch.empty((b, c, h + n), dtype=x.dtype, device=x.device)
    hist = history if history is not None else x  # any pointer: never read without a history
    grid = (b * c, triton.cdiv(h + n, BLOCK))
    _snake_cat_kernel[grid](
        x, hist, params.contiguous(), bias if bias is not None else params, out, c, n, h,
        x.stride(0), x.stride(1), hist.stride(0), hist.stride(1),
        HAS_HIST=history is not None, HAS_BIAS=bias is not None, BLOCK=BLOCK,
    )  # fmt: skip
    return out


def snake_split(
    x: torch.Tensor, params: torch.Tensor, history: torch.Tensor | None, pad: int, keep: int, dilation: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`snake_cat`'s ``[history | snake(x)]`` as its ``dilation`` phases ``[B * d, C, q]`` (zeros past its
    width: :func:`~omni_stream.runtime.layout.to_phases`), and its last ``keep`` samples (``keep`` 0: None): in
    one pass when channel-major, the input of a dilated convolution over its phases and its next history."""
    if channels_last(x):
        return _snake_cat_channels_last(x, params, history, pad, None, dilation=dilation, keep=keep)
    y = snake_cat(x, params, history, pad)
    return to_phases(y, dilation), (y[..., y.shape[2] - keep :] if keep else None)


@triton.jit
def _residual_add_kernel(
    h_ptr, bias_ptr, x_ptr, out_ptr, channels, n, h_sb, h_sc, x_sb, x_sc, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    b = (row // channels).to(tl.int64)
    c = row % channels
    live = t < n
    h = tl.load(h_ptr + b * h_sb + c * h_sc + t, mask=live, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * x_sb + c * x_sc + t, mask=live, other=0.0).to(tl.float32)
    y = h + tl.load(bias_ptr + c).to(tl.float32) + x
    tl.store(out_ptr + row.to(tl.int64) * n + t, y.to(out_ptr.dtype.element_ty), mask=live)


def residual_add(h: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``h + bias[:, None] + x`` for ``[B, C, n]`` (strided views allowed); a new tensor, contiguous, or
    channel-major when ``h`` is."""
    if channels_last(h):
        return _residual_add_channels_last(h, bias, x)
    h, x = _unit_time_stride(h), _unit_time_stride(x)
    b, c, n = h.shape
    out = torch.empty((b, c, n), dtype=h.dtype, device=h.device)
    grid = (b * c, triton.cdiv(n, BLOCK))
    _residual_add_kernel[grid](
        h, bias, x, out, c, n, h.stride(0), h.stride(1), x.stride(0), x.stride(1), BLOCK=BLOCK
    )  # fmt: skip
    return out


@triton.jit
def _conv_to_one_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, channels, n_in, n_out, x_sb, x_sc,
    KERNEL: tl.constexpr, DILATION: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = t < n_out
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(channels):
        row = x_ptr + b * x_sb + c * x_sc
        for k in tl.static_range(KERNEL):
            w = tl.load(w_ptr + c * KERNEL + k).to(tl.float32)
            acc += w * tl.load(row + t + k * DILATION, mask=live, other=0.0).to(tl.float32)
    acc += tl.load(bias_ptr).to(tl.float32)
    tl.store(out_ptr + b * n_out + t, acc.to(out_ptr.dtype.element_ty), mask=live)


def conv_to_one(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int = 1) -> torch.Tensor:
    """``conv1d(x, weight, bias, dilation=dilation)`` with one output channel: ``x [B, C, n]``, ``weight [1, C, k]``;
    no padding (the input holds its left context). Returns ``[B, 1, n - (k - 1) * dilation]``."""
    if channels_last(x):
        return _conv_to_one_channels_last(x, weight, bias, dilation)
    x = _unit_time_stride(x)
    b, c, n = x.shape
    k = weight.shape[2]
    n_out = n - (k - 1) * dilation
    out = torch.empty((b, 1, n_out), dtype=x.dtype, device=x.device)
    grid = (b, triton.cdiv(n_out, CONV_BLOCK))
    _conv_to_one_kernel[grid](
        x, weight.contiguous(), bias, out, c, n, n_out, x.stride(0), x.stride(1),
        KERNEL=k, DILATION=dilation, BLOCK=CONV_BLOCK,
    )  # fmt: skip
    return out


# ---------------------------------------------------------------- channel-major twins


def _channel_tile(c: int, block: int) -> tuple[int, int]:
    """(BLOCK_C, BLOCK_T) of a channel-major tile of ``block`` elements: at most ``WIDE`` channels, the largest
    power of two that divides ``c`` when that is 8 or more (96 channels: 32, so no lane idles), else ``c`` to a
    power of two (the lanes past ``c`` masked), at each of ``block // BLOCK_C`` samples. Tiles, not a flat index:
    recovering each element's channel and sample by division would cost more than its load. The grid puts the
    tiles along time on its first axis, the only one not limited to 65535."""
    wide = min(WIDE, c & -c if c % 8 == 0 else triton.next_power_of_2(c))
    return wide, block // wide


@triton.jit
def _snake_cat_cl_kernel(
    x_ptr, h_ptr, p_ptr, bias_ptr, out_ptr, tail_ptr, channels, n, hist, span, q, keep,
    x_sb, x_sc, x_st, h_sb, h_sc, h_st,
    HAS_HIST: tl.constexpr, HAS_BIAS: tl.constexpr, X_PHASES: tl.constexpr, OUT_PHASES: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    # s: the position along the output's time axis; with OUT_PHASES > 1 the output holds the phases of
    # [history | snake(x)] (row b * d + r: samples r, r + d, ...), so s = r * q + i is sample t = i * d + r
    s = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    b = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    if OUT_PHASES == 1:
        t = s
    else:
        t = (s % q) * OUT_PHASES + s // q
    width = hist + n
    live_c = c < channels
    live = live_c & (s < span)
    alpha = tl.load(p_ptr + c, mask=live_c, other=0.0).to(tl.float32)
    inv_beta = tl.load(p_ptr + channels + c, mask=live_c, other=0.0).to(tl.float32)
    new = live & (t >= hist) & (t < width)
    u = tl.maximum(t - hist, 0)  # x's sample; with X_PHASES > 1 x holds its phases: row b * d + u % d, at u // d
    x_at = x_ptr + (b * X_PHASES + u % X_PHASES) * x_sb + c * x_sc + (u // X_PHASES) * x_st
    x = tl.load(x_at, mask=new, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + c, mask=live_c, other=0.0).to(tl.float32)
    sn = tl.sin(x * alpha)
    y = x + inv_beta * (sn * sn)
    old = t < hist
    if HAS_HIST:
        h = tl.load(h_ptr + b * h_sb + c * h_sc + t * h_st, mask=live & old, other=0.0).to(tl.float32)
        y = tl.where(old, h, y)
    else:
        y = tl.where(old, 0.0, y)
    y = tl.where(t < width, y, 0.0).to(out_ptr.dtype.element_ty)  # the phases' padding past the width
    # the output is [B, span, C] in memory ([B * d, q, C] with phases)
    tl.store(out_ptr + b * span * channels + s * channels + c, y, mask=live)
    if keep > 0:  # the last `keep` samples, in time order ([B, keep, C] in memory): the next history
        kept = live & (t >= width - keep) & (t < width)
        tl.store(tail_ptr + b * keep * channels + (t - (width - keep)) * channels + c, y, mask=kept)


def _snake_cat_channels_last(
    x: torch.Tensor | Phases,
    params: torch.Tensor,
    history: torch.Tensor | None,
    pad: int,
    bias: torch.Tensor | None,
    *,
    dilation: int = 1,
    keep: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[history | snake(x + bias)]``, channel-major, as it is (``dilation`` 1) or as its ``dilation`` phases
    (``[B * d, C, q]``, zeros past the width), and its last ``keep`` samples (``keep`` 0: None). ``x`` held as
    phases is read in place."""
    b, c, n = x.shape
    data, x_phases = (x.data, x.dilation) if isinstance(x, Phases) else (x, 1)
    h = history.shape[2] if history is not None else pad
    q = -(-(h + n) // dilation)
    span = q * dilation
    dtype, device = data.dtype, data.device
    out = torch.empty((b * dilation, q, c), dtype=dtype, device=device).transpose(1, 2)
    tail = torch.empty((b, keep, c), dtype=dtype, device=device).transpose(1, 2) if keep else None
    hist = history if history is not None else data  # any pointer: never read without a history
    block_c, block_t = _channel_tile(c, BLOCK)
    _snake_cat_cl_kernel[(triton.cdiv(span, block_t), b, triton.cdiv(c, block_c))](
        data, hist, params.contiguous(), bias if bias is not None else params, out,
        tail if tail is not None else out, c, n, h, span, q, keep, *data.stride(), *hist.stride(),
        HAS_HIST=history is not None, HAS_BIAS=bias is not None, X_PHASES=x_phases, OUT_PHASES=dilation,
        BLOCK_C=block_c, BLOCK_T=block_t,
    )  # fmt: skip
    return out, tail


@triton.jit
def _residual_add_cl_kernel(
    h_ptr, bias_ptr, x_ptr, out_ptr, channels, n, h_sb, h_sc, h_st, x_sb, x_sc, x_st,
    BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    b = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    live_c = c < channels
    live = live_c & (t < n)
    h = tl.load(h_ptr + b * h_sb + c * h_sc + t * h_st, mask=live, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * x_sb + c * x_sc + t * x_st, mask=live, other=0.0).to(tl.float32)
    y = h + tl.load(bias_ptr + c, mask=live_c, other=0.0).to(tl.float32) + x
    tl.store(out_ptr + b * n * channels + t * channels + c, y.to(out_ptr.dtype.element_ty), mask=live)


def _residual_add_channels_last(h: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    b, c, n = h.shape
    out = empty_like_layout(h, (b, c, n))
    block_c, block_t = _channel_tile(c, BLOCK)
    _residual_add_cl_kernel[(triton.cdiv(n, block_t), b, triton.cdiv(c, block_c))](
        h, bias, x, out, c, n, *h.stride(), *x.stride(), BLOCK_C=block_c, BLOCK_T=block_t
    )  # fmt: skip
    return out


@triton.jit
def _conv_to_one_cl_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, channels, n_out, x_sb, x_sc, x_st,
    KERNEL: tl.constexpr, DILATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(1).to(tl.int64)
    live_t = t < n_out
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)  # a tile of samples x channels, channels contiguous
    for c0 in range(0, channels, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        live_c = c < channels
        for k in tl.static_range(KERNEL):
            w = tl.load(w_ptr + c * KERNEL + k, mask=live_c, other=0.0).to(tl.float32)
            at = x_ptr + b * x_sb + (t[:, None] + k * DILATION) * x_st + c[None, :] * x_sc
            x = tl.load(at, mask=live_t[:, None] & live_c[None, :], other=0.0).to(tl.float32)
            acc += x * w[None, :]
    y = tl.sum(acc, axis=1) + tl.load(bias_ptr).to(tl.float32)
    tl.store(out_ptr + b * n_out + t, y.to(out_ptr.dtype.element_ty), mask=live_t)


def _conv_to_one_channels_last(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int
) -> torch.Tensor:
    b, c, n = x.shape
    k = weight.shape[2]
    n_out = n - (k - 1) * dilation
    out = torch.empty((b, 1, n_out), dtype=x.dtype, device=x.device)
    block_c, block_t = _channel_tile(c, CONV_BLOCK)
    _conv_to_one_cl_kernel[(triton.cdiv(n_out, block_t), b)](
        x, weight.contiguous(), bias, out, c, n_out, *x.stride(),
        KERNEL=k, DILATION=dilation, BLOCK_C=block_c, BLOCK_T=block_t,
    )  # fmt: skip
    return out
