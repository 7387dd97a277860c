"""The shapes Whisper's decoder step runs at, and the set of them captured as CUDA graphs at load.

One decoder call runs over the slots ``0..rows-1`` (a row per slot: idle slots below the highest live one compute
along), feeds each row up to ``width`` inputs and lets them attend ``span`` positions of the self-attention cache
(cross-attention reads the encoder's 1500 frames, masked past a shorter window). A call's shape
``(rows, width, span)`` is a bucket:

- ``rows``: powers of two up to ``max_batch_size``, then ``max_batch_size``
  (:func:`~omni_stream.runtime.cuda_graphs.batch_buckets`);
- ``width``: 1 (every generated token, and language detection's lone ``<|startoftranscript|>``), then
  :data:`SMALLEST_WIDTH` doubling up to the longest prompt (a plain prompt is 2 to 4 tokens; a request's context
  prompt makes it up to half the positions);
- ``span``: a one-token call attends the smallest of :data:`SMALLEST_SPAN` doubling up to the decoder's positions
  that covers its rows (a step's cost follows the transcripts' lengths); a call that feeds a prompt attends every
  position (a request feeds its prompt once, so one span per width keeps the graphs few: for 32 slots and 448
  positions, 6 x (4 + 7) = 66).

:meth:`DecodeShapes.keys` is every shape :meth:`DecodeShapes.pick` can return, so a step never meets a shape that
was not captured: a batch size seen for the first time costs what it costs the tenth time.

The encoder's window (:func:`encoder_windows`, :func:`window_for`): Whisper was trained on 30 s windows, a short
utterance padded with silence, so by default every utterance is encoded in the whole window (1500 frames), and a 3 s
turn pays for 27 s of silence: on the H200 a pass over 32 utterances takes 212 ms (``asr_bench``), most of a voice
turn's transcript under load. With a smaller window set (``transcription_window_ms``), an utterance is encoded in the
smallest of the doubling windows that holds it and :data:`WINDOW_MARGIN_S` more, and the decoder's cross-attention
reads only those frames (whisper.cpp's ``audio_ctx``). That is a real accuracy trade on Whisper's own weights
(positions past the window were always there in training: set too low, a decoder can fail to stop); checkpoints
fine-tuned for short windows (e.g. FUTO's ACFT Whisper) are made for it. The window depends on the utterance alone,
never on its batch, so a transcript is the same whichever pass encodes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni_stream.runtime.cuda_graphs import batch_buckets, length_buckets, pick

SMALLEST_WIDTH = 4  # inputs; the multilingual plain prompt (sot, language, task, no-timestamps)
SMALLEST_SPAN = 64  # positions; a short turn's prompt and transcript
FRAMES_PER_SECOND = 50  # encoder frames (two log-mel frames of 10 ms each, halved by the second convolution)
# Audio an utterance's window holds beyond its own length (transcribe.cpp's adaptive window found no WER change on
# its short-form corpus with a 2 s margin and a 10 s floor)
WINDOW_MARGIN_S = 2.0


@dataclass(slots=True, frozen=True)
class DecodeShapes:
    """Bucket sizes of a decoder call, ascending; ``spans[-1]`` is the decoder's positions."""

    rows: tuple[int, ...]
    widths: tuple[int, ...]
    spans: tuple[int, ...]

    @classmethod
    def build(cls, max_batch_size: int, positions: int, max_width: int) -> DecodeShapes:
        """The buckets for ``max_batch_size`` slots, ``positions`` decoder positions and prompts of up to
        ``max_width`` tokens (capped by ``positions``)."""
        widest = max(1, min(max_width, positions))
        widths = tuple(sorted({1, *length_buckets(widest, SMALLEST_WIDTH)}))
        return cls(batch_buckets(max_batch_size), widths, length_buckets(positions, SMALLEST_SPAN))

    def pick(self, rows: int, width: int, span: int) -> tuple[int, int, int] | None:
        """The bucket of a call over ``rows`` slots, feeding at most ``width`` inputs a row, whose rows reach
        ``span`` positions; None when one of them exceeds every bucket."""
        b, w = pick(self.rows, rows), pick(self.widths, width)
        s = pick(self.spans, span) if w == 1 else self.spans[-1]
        if b is None or w is None or s is None or span > s:
            return None
        return b, w, s

    def keys(self) -> tuple[tuple[int, int, int], ...]:
        """Every shape :meth:`pick` returns (what is captured at load)."""
        full = self.spans[-1]
        return tuple((b, w, s) for b in self.rows for w in self.widths for s in (self.spans if w == 1 else (full,)))


def encoder_windows(full: int, smallest: int | None) -> tuple[int, ...]:
    """The encoder windows, in frames, ascending: ``smallest`` doubling while below ``full``, then ``full`` (the
    model's whole window); ``(full,)`` when ``smallest`` is None or not below it. Doubling keeps them few (each is a
    set of captured encoder graphs) and pads an utterance by at most its window's half."""
    if smallest is None or smallest >= full:
        return (full,)
    if smallest < 1:
        raise ValueError(f"an encoder window must be at least one frame, got {smallest}")
    windows = []
    w = smallest
    while w < full:
        windows.append(w)
        w *= 2
    return (*windows, full)


def window_for(seconds: float, windows: tuple[int, ...]) -> int:
    """The window an utterance of ``seconds`` is encoded in: the smallest that holds it and :data:`WINDOW_MARGIN_S`
    more (the whole window when none does)."""
    need = (seconds + WINDOW_MARGIN_S) * FRAMES_PER_SECOND
    return next((w for w in windows if w >= need), windows[-1])
