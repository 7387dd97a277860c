"""runtime/layout.py: channel-major activations, and convolutions that keep them so without copies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from omni_stream.runtime.layout import (
    channels_last,
    conv1d,
    conv_transpose1d,
    empty_like_layout,
    to_channels_last,
)


def _copies(fn) -> tuple[torch.Tensor, int]:
    """``fn()`` and how many tensor copies it made (the profiler's ``aten::copy_`` calls)."""
    with profile() as prof:
        out = fn()
    return out, sum(e.name == "aten::copy_" for e in prof.events())


def test_the_layouts_are_told_apart_and_made() -> None:
    x = torch.randn(2, 5, 7)
    assert not channels_last(x)
    last = to_channels_last(x)
    assert channels_last(last) and torch.equal(last, x) and last.stride() == (35, 1, 5)
    assert channels_last(last[..., 2:])  # a slice along time stays channel-major
    assert not channels_last(torch.randn(2, 1, 7).transpose(1, 2).transpose(1, 2))  # one channel: time-major
    w = to_channels_last(torch.randn(4, 3, 1))  # k = 1: the strides alone say channel-major
    assert channels_last(w) and w.stride() == (3, 1, 3)
    assert channels_last(empty_like_layout(last, (2, 3, 4))) and empty_like_layout(x, (2, 3, 4)).is_contiguous()


@pytest.mark.parametrize("dilation, groups", [(1, 1), (3, 1), (9, 2)])
def test_a_channel_major_convolution_stays_channel_major_without_copies(dilation: int, groups: int) -> None:
    x = to_channels_last(torch.randn(2, 8, 80))  # dense, as every buffer the vocoder's kernels write
    w, b = to_channels_last(torch.randn(6, 8 // groups, 7)), torch.randn(6)
    want = F.conv1d(x.contiguous(), w.contiguous(), b, dilation=dilation, groups=groups)
    _, plain = _copies(lambda: F.conv1d(x, w, b, dilation=dilation, groups=groups))
    assert plain >= 2  # aten makes a 3-D input time-major, the channel-major weight brings it back
    got, copies = _copies(lambda: conv1d(x, w, b, dilation, groups))
    assert copies == 0 and channels_last(got)
    assert torch.allclose(got, want, atol=1e-5)
    view = x[..., 3:]  # a slice along time: the same values as F.conv1d's
    want = F.conv1d(view.contiguous(), w.contiguous(), b, dilation=dilation, groups=groups)
    assert torch.allclose(conv1d(view, w, b, dilation, groups), want, atol=1e-5)
    tm = conv1d(view.contiguous(), w.contiguous(), b, dilation, groups)  # time-major in: F.conv1d itself
    assert tm.is_contiguous() and torch.allclose(tm, want, atol=1e-5)


def test_a_channel_major_transposed_convolution_stays_channel_major_without_copies() -> None:
    x = to_channels_last(torch.randn(2, 8, 30))
    w, b = to_channels_last(torch.randn(8, 4, 10)), torch.randn(4)
    want = F.conv_transpose1d(x.contiguous(), w.contiguous(), b, stride=5)
    got, copies = _copies(lambda: conv_transpose1d(x, w, b, 5))
    assert copies == 0 and channels_last(got)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(conv_transpose1d(x.contiguous(), w.contiguous(), b, 5), want, atol=1e-5)


def test_with_a_time_major_weight_the_convolutions_are_the_plain_ones() -> None:
    """The served default (time-major weights): a channel-major input (as the codec transformer's transposed
    output is) goes through ``F.conv1d`` / ``F.conv_transpose1d`` unchanged, so it comes out time-major."""
    x = to_channels_last(torch.randn(2, 8, 30))
    w, wt = torch.randn(6, 8, 3), torch.randn(8, 4, 10)
    y = conv1d(x, w, None, 2)
    assert y.is_contiguous() and torch.equal(y, F.conv1d(x, w, None, dilation=2))
    t = conv_transpose1d(x, wt, None, 5)
    assert t.is_contiguous() and torch.equal(t, F.conv_transpose1d(x, wt, None, stride=5))
