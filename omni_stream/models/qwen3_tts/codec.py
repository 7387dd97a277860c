"""The 12 Hz speech-tokenizer decoder (codes -> 24 kHz audio), with hub parameter names.

Every block is causal. Stateful blocks (convs with left context, transposed convs with overlap, windowed
attention) take an optional ``state`` dict: ``None`` means "start of stream" (zero left padding, positions
from 0), which is exactly what a whole-utterance decode does; a dict carries per-request histories between
windows (see ``codec_stream``). One code path serves both, so a streamed decode equals the full decode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from omni_stream.errors import ConfigError
from omni_stream.runtime.layout import Phases, channels_last, conv1d, conv_transpose1d, to_channels_last, to_phases
from omni_stream.runtime.settings import CODEC_DILATIONS, Tuning

from .codec_config import CodecDecoderConfig, SpeechTokenizerConfig
from .codec_quantizer import DerivedTensor, SplitResidualVQ
from .codec_transformer import POSITION_KEY, CodecTransformer, State, StatefulBlock

if TYPE_CHECKING:
    from .codec_encoder import MimiEncoder


class CausalConv1d(StatefulBlock):
    """Conv1d with ``(k-1)*dilation`` zero left padding (stride 1); ``.conv`` holds the hub weights."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1, bias: bool = True):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups, bias=bias)
        self.context = (kernel - 1) * dilation
        self.phases = False  # compute as a convolution without dilation over the input's phases (conv_phases)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.state_key: (self.conv.in_channels, self.context)} if self.context else {}

    def forward(
        self, x: Tensor, state: State | None = None, act: SnakeBeta | None = None, *, bias: bool = True
    ) -> Tensor:
        """``act``: the activation before this convolution, applied to the new input only (the history holds
        activated inputs already), fused with the concatenation when its ``kernels`` are set; ``bias=False``:
        leave this convolution's bias to whatever reads its output (a fused path adds it there)."""
        history = state[self.state_key] if self.context and state is not None else None
        if act is not None:
            x = act.cat(x, history, self.context if history is None else 0)
        elif history is not None:
            x = torch.cat([history, x], dim=-1)
        elif self.context:
            x = F.pad(x, (self.context, 0))
        if history is not None:
            assert state is not None
            state[self.state_key] = x[..., -self.context :]
        conv = self.conv
        kernels = act.kernels if act is not None else None
        if kernels is not None and conv.out_channels == 1 and conv.groups == 1 and conv.bias is not None:
            return kernels.conv_to_one(x, conv.weight, conv.bias, conv.dilation[0])
        if self.phases:
            return conv_phases(x, conv.weight, conv.bias if bias else None, conv.dilation[0], conv.groups)
        return conv1d(x, conv.weight, conv.bias if bias else None, conv.dilation[0], conv.groups)

    def over_phases(self, x: Tensor, state: State | None, act: SnakeBeta) -> Phases:
        """The fused path of a dilated convolution over its phases (``self.phases``), ``act`` before it, its bias
        left to the next pass: ``act``'s pass writes the input as its phases and the new history at once
        (``snake_split``), and the output stays as phases for the next pass to read. The same sums as
        :func:`conv_phases` without its two copies: a 128 x 25 window on the H200 83.5 -> 67.1 ms (run 25;
        the copies were 18.5 ms of it, the Snakes' phase-ordered passes cost 1.6 ms more)."""
        history = state[self.state_key] if state is not None else None
        d = self.conv.dilation[0]
        keep = self.context if history is not None else 0
        data, tail = act.split(x, history, self.context - keep, keep, d)
        if tail is not None:
            assert state is not None
            state[self.state_key] = tail
        y = conv1d(data, self.conv.weight, None, groups=self.conv.groups)  # [B * d, C_out, q - k + 1]
        return Phases(y, d, x.shape[2])


class CausalConvTranspose1d(StatefulBlock):
    """ConvTranspose1d trimmed by ``k - s`` on the right; streaming keeps the ``ceil(k/s) - 1`` previous inputs."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.history = -(-kernel // stride) - 1

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {self.state_key: (self.conv.in_channels, self.history)} if self.history else {}

    def forward(self, x: Tensor, state: State | None = None, act: SnakeBeta | None = None) -> Tensor:
        """``act`` as for :class:`CausalConv1d`."""
        n = x.shape[-1]
        h = 0
        history = state[self.state_key] if self.history and state is not None else None
        if act is not None:
            x = act.cat(x, history)
        elif history is not None:
            x = torch.cat([history, x], dim=-1)
        if history is not None:
            assert state is not None
            h = self.history
            state[self.state_key] = x[..., -h:]
        # Output step j only sums inputs i with i*s <= j, so [h*s, (h+n)*s) is exact given h inputs of history;
        # a zero history adds nothing but the bias, which every output step gets once either way.
        y = conv_transpose1d(x, self.conv.weight, self.conv.bias, self.stride)
        return y[..., h * self.stride : (h + n) * self.stride]


def conv_phases(x: Tensor, weight: Tensor, bias: Tensor | None, dilation: int, groups: int = 1) -> Tensor:
    """``conv1d(x, weight, bias, dilation=dilation)`` without padding, as one convolution without dilation over
    the input's ``dilation`` phases stacked along the batch: output ``t = q * d + r`` sums ``x[t + j * d]``, which
    is row ``r`` of ``x`` taken every ``d``-th sample, convolved densely at ``q``. The same products and sums
    (cuDNN may order the sums differently); two more passes over the activation (the phases out and back), each
    in the layout it came in (:func:`channels_last` or not). The fused path spares both
    (:meth:`CausalConv1d.over_phases`).

    Why: for the vocoder's dilation-9 convolution of its 384-channel stage (input ``[128, 384, 4054]`` in a
    window of 128 x 25 frames) cuDNN runs ``implicit_convolve_sgemm``, without tensor cores: 35.4 ms of a 119 ms
    window on the H200 (``benchmarks/results/codec_decoder_shapes.txt``, run 23), where the convolutions without
    dilation run on tensor cores. Returns ``[B, C_out, n - (k - 1) * dilation]`` (a view).
    """
    if dilation == 1:
        return conv1d(x, weight, bias, groups=groups)
    n_out = x.shape[2] - (weight.shape[2] - 1) * dilation
    y = conv1d(to_phases(x, dilation), weight, bias, groups=groups)  # [B * d, C_out, q - k + 1]
    return Phases(y, dilation, n_out).joined()


def snake_cat(
    x: Tensor | Phases, params: Tensor, history: Tensor | None, pad: int = 0, bias: Tensor | None = None
) -> Tensor:
    """``[history | snake(x + bias)]`` along time (``history`` None: ``pad`` zero columns; ``bias [C]`` None:
    none; ``x`` held as phases: joined first); ``params [2, C, 1]`` holds ``exp(alpha)`` and
    ``1 / (exp(beta) + 1e-9)``. Operation by operation, as the reference rounds."""
    if isinstance(x, Phases):
        x = x.joined()
    if bias is not None:
        x = x + bias[:, None]
    alpha, inv_beta = params
    y = x + inv_beta * torch.pow(torch.sin(x * alpha), 2)
    if history is not None:
        return torch.cat([history, y], dim=-1)
    return F.pad(y, (pad, 0)) if pad else y


def snake_split(
    x: Tensor, params: Tensor, history: Tensor | None, pad: int, keep: int, dilation: int
) -> tuple[Tensor, Tensor | None]:
    """:func:`snake_cat`'s ``[history | snake(x)]`` as its ``dilation`` phases (:func:`to_phases`: zeros past its
    width), and its last ``keep`` samples (a streaming convolution's next history; ``keep`` 0: None)."""
    y = snake_cat(x, params, history, pad)
    return to_phases(y, dilation), (y[..., y.shape[2] - keep :] if keep else None)


def _residual_add(h: Tensor, bias: Tensor, x: Tensor) -> Tensor:
    return h + bias[:, None] + x


def _conv_to_one(x: Tensor, weight: Tensor, bias: Tensor, dilation: int = 1) -> Tensor:
    return F.conv1d(x, weight, bias, dilation=dilation)


@dataclass(frozen=True, slots=True)
class VocoderKernels:
    """How the decoder's audio-rate stages compute when fused (:meth:`CodecDecoder.use_kernels`): each Snake
    activation in one pass with its convolution's left context and the bias of the convolution before it, a
    residual unit's bias and residual sum in one pass, the one-channel output convolution as its own kernel
    (:mod:`omni_stream.runtime.triton_vocoder` says why). :data:`TORCH_VOCODER` is the torch version of each.
    ``phases``: the dilations whose convolutions run over their input's phases; with ``snake_split`` the Snake
    before such a convolution writes its phases and the Snake after it reads them (:meth:`CausalConv1d.over_phases`),
    without it they are copied out and back (:func:`conv_phases`);
    ``channels_last``: the vocoder's convolution weights, and so its activations, channel-major
    (:mod:`omni_stream.runtime.layout`: no layout conversion around cuDNN's tensor-core kernels)."""

    name: str
    snake_cat: Callable[[Tensor | Phases, Tensor, Tensor | None, int, Tensor | None], Tensor]
    residual_add: Callable[[Tensor, Tensor, Tensor], Tensor]
    conv_to_one: Callable[[Tensor, Tensor, Tensor, int], Tensor]
    snake_split: Callable[[Tensor, Tensor, Tensor | None, int, int, int], tuple[Tensor, Tensor | None]] | None = None
    phases: frozenset[int] = frozenset()
    channels_last: bool = False


TORCH_VOCODER = VocoderKernels("torch", snake_cat, _residual_add, _conv_to_one, snake_split)
RESIDUAL_DILATIONS = (1, 3, 9)  # a decoder block's residual units
DILATED = frozenset(d for d in RESIDUAL_DILATIONS if d > 1)
assert DILATED == CODEC_DILATIONS, "Tuning.codec_phases chooses among these"


class SnakeBeta(nn.Module):
    """``x + 1/(exp(beta)+1e-9) * sin(exp(alpha) * x)^2``; alpha, beta stored in log space.

    ``kernels``: set by :meth:`CodecDecoder.use_kernels` (None: the module path, the reference's rounding).
    """

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.kernels: VocoderKernels | None = None
        self._derived = DerivedTensor()

    @staticmethod
    def _fold(alpha: Tensor, beta: Tensor) -> Tensor:
        # [2, C, 1]: exp(alpha) and 1 / (exp(beta) + 1e-9), rounded in the weight dtype as the reference does
        return torch.stack([torch.exp(alpha), 1.0 / (torch.exp(beta) + 1e-9)])[..., None]

    def params(self) -> Tensor:
        return self._derived.get(self._fold, self.alpha, self.beta)

    def cat(self, x: Tensor | Phases, history: Tensor | None, pad: int = 0, bias: Tensor | None = None) -> Tensor:
        """``[history or pad zeros | self(x + bias)]``: the input of the convolution that follows."""
        fn = self.kernels.snake_cat if self.kernels is not None else snake_cat
        return fn(x, self.params(), history, pad, bias)

    def split(
        self, x: Tensor, history: Tensor | None, pad: int, keep: int, dilation: int
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`cat` as its ``dilation`` phases and its last ``keep`` samples (:func:`snake_split`)."""
        fn = self.kernels.snake_split if self.kernels is not None else None
        return (fn or snake_split)(x, self.params(), history, pad, keep, dilation)

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        return self.cat(x, None)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        h = self.dwconv(x, state).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        kernels = self.act1.kernels
        if kernels is None:
            return self.conv2(self.conv1(x, state, self.act1), state, self.act2) + x
        # fused: conv1's bias goes into act2's pass, conv2's into the residual sum's
        h: Tensor | Phases
        if self.conv1.phases and kernels.snake_split is not None:
            h = self.conv1.over_phases(x, state, self.act1)
        else:
            h = self.conv1(x, state, self.act1, bias=False)
        assert self.conv1.conv.bias is not None and self.conv2.conv.bias is not None
        h = conv1d(self.act2.cat(h, None, 0, self.conv1.conv.bias), self.conv2.conv.weight)
        return kernels.residual_add(h, self.conv2.conv.bias, x)


class DecoderBlock(nn.Module):
    """SnakeBeta -> transposed conv (x rate) -> residual units with dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        units: list[nn.Module] = [SnakeBeta(cin), CausalConvTranspose1d(cin, cout, 2 * rate, rate)]
        units += [ResidualUnit(cout, d) for d in RESIDUAL_DILATIONS]
        self.block = nn.ModuleList(units)

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        act, tconv, *units = self.block
        x = tconv(x, state, act)
        for unit in units:
            x = unit(x, state)
        return x


class CodecDecoder(nn.Module):
    """``codes [B, Q, n] -> audio [B, 1, n * samples_per_frame]`` in the weight dtype, clamped to [-1, 1]."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitResidualVQ(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = CodecTransformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        blocks: list[nn.Module] = [CausalConv1d(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            blocks.append(DecoderBlock(cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), rate))
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        blocks += [SnakeBeta(out_dim), CausalConv1d(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(blocks)
        for name, module in self.named_modules():
            if isinstance(module, StatefulBlock):
                module.state_key = name

    def use_kernels(self, kernels: VocoderKernels | None) -> None:
        """Compute the audio-rate stages by ``kernels`` (None: module by module, the reference's rounding), with
        their dilated convolutions over phases and their weights' layout; the loader sets
        :func:`vocoder_kernels`'s choice for the device."""
        phases = kernels.phases if kernels is not None else frozenset()
        for module in self.modules():
            if isinstance(module, SnakeBeta):
                module.kernels = kernels
            elif isinstance(module, CausalConv1d):
                module.phases = module.conv.dilation[0] > 1 and module.conv.dilation[0] in phases
        last = kernels is not None and kernels.channels_last
        for module in self.decoder.modules():  # cuDNN writes a convolution's output in its weight's layout
            if isinstance(module, (CausalConv1d, CausalConvTranspose1d)) and module.conv.out_channels > 1:
                w = module.conv.weight
                if channels_last(w.data) != last:
                    w.data = to_channels_last(w.data) if last else w.data.clone(memory_format=torch.contiguous_format)

    def stateful_blocks(self) -> Iterator[StatefulBlock]:
        for module in self.modules():
            if isinstance(module, StatefulBlock):
                yield module

    def zero_state(
        self, batch: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> State:
        """Start-of-stream state for ``batch`` rows (zero histories equal the full decode's zero left padding)."""
        weight = self.pre_conv.conv.weight
        device = weight.device if device is None else device
        dtype = weight.dtype if dtype is None else dtype
        state = {POSITION_KEY: torch.zeros(batch, dtype=torch.long, device=device)}
        for block in self.stateful_blocks():
            for key, shape in block.state_shapes().items():
                state[key] = torch.zeros((batch, *shape), dtype=dtype, device=device)
        return state

    def decode_long(self, codes: Tensor, chunk_frames: int) -> Tensor:
        """Whole-utterance decode in ``chunk_frames`` windows carrying full state: exact, bounded attention memory."""
        if codes.shape[-1] <= chunk_frames:
            return self(codes)
        state = self.zero_state(codes.shape[0], codes.device)
        parts = [self(codes[..., s : s + chunk_frames], state) for s in range(0, codes.shape[-1], chunk_frames)]
        return torch.cat(parts, dim=-1)

    def forward(self, codes: Tensor, state: State | None = None) -> Tensor:
        if codes.shape[1] != self.cfg.num_quantizers:
            raise ValueError(f"expected {self.cfg.num_quantizers} codebooks, got codes of shape {tuple(codes.shape)}")
        h = self.pre_conv(self.quantizer.decode(codes), state)
        h = self.pre_transformer(h.transpose(1, 2), state).transpose(1, 2)
        for stage in self.upsample:
            tconv, block = cast(nn.ModuleList, stage)
            h = block(tconv(h, state), state)
        *blocks, act, conv = self.decoder
        for module in blocks:
            h = module(h, state)
        h = conv(h, state, act)
        if state is not None:
            state[POSITION_KEY] = state[POSITION_KEY] + codes.shape[-1]
        return h.clamp(min=-1.0, max=1.0)


def channels_last_setting(tuning: Tuning) -> bool:
    """Whether the fused vocoder's activations are channel-major per time step: ``tuning.codec_channels_last``, by
    default (None) exactly when every dilated convolution runs over its phases (``tuning.codec_phases``, default
    both; :func:`conv_phases`).

    Phases, measured on the H200 (``benchmarks/results/tts_bench.md``, run 24; ``benchmarks/codec_decoder.py``):
    cuDNN runs the 384-channel dilation-9 convolution of a 128 x 25 window without tensor cores (35.7 of its
    118 ms); over its phases the window takes 92 ms, and with the dilation-3 ones too and channel-major activations
    82 ms (67 ms since the Snakes write and read the phases, run 25). Layout (run 24): with every dilated
    convolution over its phases, channel-major activations spare cuDNN's layout conversions around each
    convolution (16 ms of a 128 x 25 window), 96 -> 82 ms, and every smaller window is faster too (1 x 25: 3.10 ->
    2.57 ms). Not with a dilated convolution left: cuDNN's NHWC kernels for those are slow at some shapes (a 32 x 4
    window 8.7 -> 76 ms with phases for 9 only).
    """
    if tuning.codec_channels_last is not None:
        return tuning.codec_channels_last
    return tuning.codec_phases == DILATED


def vocoder_kernels(device: torch.device | str, tuning: Tuning | None = None) -> VocoderKernels | None:
    """The Triton kernels on CUDA when Triton is installed and ``tuning.fused`` is on, else None; with them
    ``tuning.codec_phases`` and :func:`channels_last_setting` (None: the defaults).

    Measured on the H200 (``benchmarks/results/tts_bench.md``, runs 23-24): the eager activations,
    concatenations, bias and residual passes were ~45 % of a streaming window's GPU time, at the audio-rate stages
    where the convolutions are narrow (96-384 channels); a window of 128 x 25 frames fell from 212 to 118 ms, and
    with the default settings (phases, channel-major) to 82 ms, and with the phases in the Snakes' passes to 67 ms
    (run 25).
    """
    t = Tuning() if tuning is None else tuning
    if torch.device(device).type != "cuda" or not t.fused:
        return None
    try:
        from omni_stream.runtime import triton_vocoder as tv
    except ImportError:
        return None
    phases, last = t.codec_phases, channels_last_setting(t)
    return VocoderKernels("triton", tv.snake_cat, tv.residual_add, tv.conv_to_one, tv.snake_split, phases, last)


class SpeechTokenizer(nn.Module):
    """The 12 Hz speech tokenizer: ``decoder`` (codes -> audio) and, when loaded, ``encoder`` (audio -> codes)."""

    def __init__(self, cfg: SpeechTokenizerConfig, with_encoder: bool = True):
        super().__init__()
        self.cfg = cfg
        self.encoder: MimiEncoder | None = None
        if with_encoder:
            from .codec_encoder import MimiEncoder

            self.encoder = MimiEncoder(cfg.encoder)
        self.decoder = CodecDecoder(cfg.decoder)

    @property
    def sample_rate(self) -> int:
        return self.cfg.output_sample_rate

    @property
    def samples_per_frame(self) -> int:
        return self.cfg.decode_upsample_rate

    @torch.inference_mode()
    def decode(self, codes: Tensor, chunk_frames: int = 300) -> Tensor:
        """``codes [B, 16, T]`` (long) -> float32 audio ``[B, T * 1920]`` in [-1, 1], at 24 kHz.

        Exact causal decode at any length: beyond ``chunk_frames`` it runs in windows with carried state
        (the reference instead re-decodes 300-frame chunks with 25 frames of context, which is approximate).
        """
        codes = codes.to(self.decoder.pre_conv.conv.weight.device)
        return self.decoder.decode_long(codes, chunk_frames).squeeze(1).float()

    @torch.inference_mode()
    def encode(self, audio: Tensor) -> Tensor:
        """24 kHz float32 mono ``[T]`` -> codes ``[ceil(T / 1920), 16]`` (long). Needs the encoder."""
        if self.encoder is None:
            raise RuntimeError("this speech tokenizer was loaded without its encoder")
        return self.encoder.encode(audio, self.cfg.encoder_valid_num_quantizers, self.cfg.encode_downsample_rate)


def speech_tokenizer_dir(ckpt_dir: str | Path) -> Path:
    """``ckpt_dir/speech_tokenizer`` for a model checkpoint, or ``ckpt_dir`` itself for a bare tokenizer."""
    root = Path(ckpt_dir)
    sub = root / "speech_tokenizer"
    if (sub / "config.json").is_file():
        return sub
    if (root / "config.json").is_file():
        try:
            if json.loads((root / "config.json").read_text()).get("model_type") == "qwen3_tts_tokenizer_12hz":
                return root
        except (OSError, ValueError):
            pass
    raise ConfigError(f"no speech tokenizer under {root} (expected {sub / 'config.json'})")


def load_state_strict(module: nn.Module, tensors: dict[str, Tensor], what: str) -> None:
    """``load_state_dict`` that reports missing/unexpected/mis-shaped keys as a ConfigError."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ConfigError(
            f"{what}: {len(missing)} missing weights {missing[:5]}, "
            f"{len(unexpected)} unexpected weights {unexpected[:5]}"
        )
    for name, t in tensors.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ConfigError(
                f"{what}: weight {name!r} has shape {tuple(t.shape)}, expected {tuple(expected[name].shape)}"
            )
    module.load_state_dict(tensors, strict=True)


def load_speech_tokenizer(
    ckpt_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    load_format: Literal["auto", "dummy"] = "auto",
    *,
    with_encoder: bool = True,
    seed: int = 0,
    tuning: Tuning | None = None,
) -> SpeechTokenizer:
    """Build from ``speech_tokenizer/config.json`` and load ``model.safetensors`` strictly (``dummy``: random weights).
    ``tuning``: the vocoder's kernels on CUDA (:func:`vocoder_kernels`; None: the defaults).

    The codec runs in the model dtype (bf16 when the talker is bf16), as the reference does; without the
    encoder, ``encoder.*`` weights are skipped.
    """
    directory = speech_tokenizer_dir(ckpt_dir)
    cfg = SpeechTokenizerConfig.from_file(directory / "config.json")
    model = SpeechTokenizer(cfg, with_encoder=with_encoder)
    if load_format == "dummy":
        from .codec_checkpoint import randomize_speech_tokenizer_

        randomize_speech_tokenizer_(model, seed)
    elif load_format == "auto":
        from safetensors.torch import load_file

        path = directory / "model.safetensors"
        if not path.is_file():
            raise ConfigError(f"missing speech tokenizer weights {path}")
        tensors = load_file(str(path))
        if not with_encoder:
            tensors = {k: v for k, v in tensors.items() if not k.startswith("encoder.")}
        load_state_strict(model, tensors, str(path))
    else:
        raise ConfigError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.decoder.use_kernels(vocoder_kernels(device, tuning))
    return model
