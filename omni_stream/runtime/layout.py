"""Which memory layout a ``[B, C, n]`` activation has, and new tensors in the same one.

A 1-D convolution's activation lies time-major per channel (``[B, C, n]`` contiguous, PyTorch's default) or
channel-major per time step (``[B, n, C]`` in memory, viewed as ``[B, C, n]``): the layout cuDNN's tensor-core
kernels read and write (NHWC), into which it otherwise converts every input and out of which every output.
An activation may also be held as its phases (:class:`Phases`): what a dilated convolution computed as a
convolution without dilation reads and writes.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def split_phases(x: torch.Tensor, d: int) -> torch.Tensor:
    """``[B, C, q * d] -> [B * d, C, q]``: row ``b * d + r`` holds samples ``r, r + d, ...``; in ``x``'s layout."""
    b, c, n = x.shape
    if channels_last(x):
        return x.transpose(1, 2).reshape(b, n // d, d, c).transpose(1, 2).reshape(b * d, n // d, c).transpose(1, 2)
    return x.reshape(b, c, n // d, d).permute(0, 3, 1, 2).reshape(b * d, c, n // d)


def to_phases(x: torch.Tensor, d: int) -> torch.Tensor:
    """``x [B, C, n]`` as its ``d`` phases ``[B * d, C, ceil(n / d)]`` (zero samples past ``n``), in ``x``'s
    layout: a copy, or two when ``n`` is not a multiple of ``d``."""
    n = x.shape[2]
    pad = -n % d
    if pad:
        x = F.pad(x.transpose(1, 2), (0, 0, 0, pad)).transpose(1, 2) if channels_last(x) else F.pad(x, (0, pad))
    return split_phases(x, d)


def join_phases(y: torch.Tensor, d: int) -> torch.Tensor:
    """The inverse of :func:`split_phases`: ``[B * d, C, m] -> [B, C, m * d]``, in ``y``'s layout."""
    bd, c, m = y.shape
    b = bd // d
    if channels_last(y):
        return y.transpose(1, 2).reshape(b, d, m, c).transpose(1, 2).reshape(b, m * d, c).transpose(1, 2)
    return y.reshape(b, d, c, m).permute(0, 2, 3, 1).reshape(b, c, m * d)


@dataclass(frozen=True, slots=True)
class Phases:
    """A ``[B, C, width]`` activation held as its ``dilation`` phases: ``data [B * d, C, q]`` (``q * d >= width``),
    row ``b * d + r`` holding samples ``r, r + d, ...`` of row ``b`` (:func:`split_phases`; samples past ``width``
    are padding). A dilated convolution over its phases reads and writes this; a kernel that knows the order
    reads or writes it in place of the split's and the join's copies."""

    data: torch.Tensor
    dilation: int
    width: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """The joined activation's ``(B, C, width)``."""
        bd, c, _ = self.data.shape
        return bd // self.dilation, c, self.width

    def joined(self) -> torch.Tensor:
        """The ``[B, C, width]`` activation (a copy), in ``data``'s layout."""
        return join_phases(self.data, self.dilation)[..., : self.width]
