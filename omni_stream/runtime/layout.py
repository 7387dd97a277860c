"""Which memory layout a ``[B, C, n]`` activation has, and new tensors in the same one.

A 1-D convolution's activation lies time-major per channel (``[B, C, n]`` contiguous, PyTorch's default) or
channel-major per time step (``[B, n, C]`` in memory, viewed as ``[B, C, n]``): the layout cuDNN's tensor-core
kernels read and write (NHWC), into which it otherwise converts every input and out of which every output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def channels_last(t: torch.Tensor) -> bool:
    """Whether ``[B, C, n]`` lies channel-major per time step (``[B, n, C]`` in memory)."""
    return t.shape[1] > 1 and t.stride(1) == 1 and t.stride(2) != 1


def to_channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t [B, C, n]`` (or a convolution's weight ``[C_out, C_in, k]``) with the same values, channel-major; also
    for ``n = 1``, where both layouts hold the same bytes and only the strides tell cuDNN which one is meant."""
    b, c, n = t.shape
    out = torch.empty_strided((b, c, n), (n * c, 1, c), dtype=t.dtype, device=t.device)
    return out.copy_(t)


def empty_like_layout(like: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """A new ``[B, C, n]`` tensor of ``like``'s dtype and device, in ``like``'s layout."""
    b, c, n = shape
    if channels_last(like):
        return torch.empty((b, n, c), dtype=like.dtype, device=like.device).transpose(1, 2)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, dilation: int = 1, groups: int = 1
) -> torch.Tensor:
    """``F.conv1d`` (no padding, stride 1), keeping a channel-major input channel-major without copies when the
    weight is channel-major too: for a 3-D input aten's convolution first makes it contiguous (time-major), and
    cuDNN then converts it back to NHWC for a channel-major weight, two copies a convolution; as a 2-D
    convolution over a height of one, neither. With a time-major weight this is ``F.conv1d`` whatever the input
    (a channel-major input, such as a transformer's transposed output, is made time-major as before)."""
    if channels_last(x) and channels_last(weight):
        y = F.conv2d(x.unsqueeze(2), weight.unsqueeze(2), bias, dilation=(1, dilation), groups=groups)
        return y.squeeze(2)
    return F.conv1d(x, weight, bias, dilation=dilation, groups=groups)


def conv_transpose1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int) -> torch.Tensor:
    """``F.conv_transpose1d`` (no padding), a channel-major input with a channel-major weight kept so as
    :func:`conv1d` keeps it."""
    if channels_last(x) and channels_last(weight):
        return F.conv_transpose2d(x.unsqueeze(2), weight.unsqueeze(2), bias, stride=(1, stride)).squeeze(2)
    return F.conv_transpose1d(x, weight, bias, stride=stride)
