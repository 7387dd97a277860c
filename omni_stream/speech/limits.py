"""The bounds of a speech request, in one place: pure functions the request type and every family share.

The serving layer checks only wire types and shapes; every length and range below is checked here and
raised as :class:`~omni_stream.errors.InvalidRequestError` naming the field, so the Python API, HTTP and
WebSocket clients all see the same rule with the same words (vLLM-Omni's, where its limit is ours too).

Frame budget. A request without ``max_new_tokens`` may generate at most
``frame_budget(text) = FRAME_FLOOR + FRAMES_PER_CHAR * len(text)`` codec frames (80 ms each at 12.5 Hz),
capped at :data:`MAX_NEW_TOKENS`: 2 s plus 0.24 s per character, over three times a fast English speaking
rate (15 characters a second) and above an ordinary Chinese one (5 a second), so real speech ends on its
own end-of-speech code first. It bounds
generation that never ends (random weights never emit end-of-speech; a real model can run away): a
one-sentence request on the embedded tiny checkpoint stops after ~150 frames instead of 2048.

Input length. A text of ``n`` characters needs at most ``n`` prompt positions (tokenizers give at least one
character per token) plus its frame budget, so :func:`max_input_chars` of a context is the longest text
whose prompt and default budget always fit in it; :data:`MAX_INPUT_CHARS` is that for the default context
of :data:`DEFAULT_CONTEXT` positions. A family with a context of its own checks the exact prompt length
against it once the text is tokenized.
"""

from __future__ import annotations

from omni_stream.errors import InvalidRequestError
from omni_stream.validation.fields import whole

# Codec frames a request may generate when it names no max_new_tokens (see the module docstring).
FRAME_FLOOR = 25  # 2 s of 80 ms frames, whatever the text
FRAMES_PER_CHAR = 3  # 0.24 s of audio per character
# max_new_tokens, when given (vLLM-Omni's bounds)
MIN_NEW_TOKENS = 1
MAX_NEW_TOKENS = 4096
# Text
DEFAULT_CONTEXT = 4096  # talker positions per request (prompt + frames) of the default KV cache
PROMPT_OVERHEAD = 64  # positions of the chat template and codec tags around the text
MAX_INSTRUCTIONS_CHARS = 500
# Reference audio for cloning, seconds (vLLM-Omni's bounds)
MIN_REF_SECONDS = 1.0
MAX_REF_SECONDS = 30.0
# An uploaded voice's free texts (its consent statement, its speaker description): stored with it and returned in
# every listing, so bounded.
MAX_VOICE_NOTE_CHARS = 1000
# A speaker embedding (x-vector) has at most this many values (vLLM-Omni's bound).
MAX_EMBEDDING_DIM = 8192


def frame_budget(text: str) -> int:
    """Frames a request for ``text`` may generate by default: ``FRAME_FLOOR + FRAMES_PER_CHAR * chars``, capped."""
    return min(MAX_NEW_TOKENS, FRAME_FLOOR + FRAMES_PER_CHAR * len(text.strip()))


def max_input_chars(context: int) -> int:
    """The longest text whose prompt (at most one position per character) and frame budget fit ``context``."""
    return max(1, (context - PROMPT_OVERHEAD - FRAME_FLOOR) // (1 + FRAMES_PER_CHAR))


MAX_INPUT_CHARS = max_input_chars(DEFAULT_CONTEXT)


def check_text(text: str, max_chars: int = MAX_INPUT_CHARS) -> None:
    """``input``: non-empty after stripping, at most ``max_chars`` characters."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequestError("Input text cannot be empty", "input")
    n = len(text.strip())
    if n > max_chars:
        raise InvalidRequestError(
            f"Input text too long (max {max_chars} characters, got {n}): longer text does not fit the model's "
            "context together with its speech; split it into several requests",
            "input",
        )


def check_instructions(instructions: str | None) -> None:
    """``instructions``: at most :data:`MAX_INSTRUCTIONS_CHARS` characters."""
    if instructions is not None and len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise InvalidRequestError(f"Instructions too long (max {MAX_INSTRUCTIONS_CHARS} characters)", "instructions")


def check_max_new_tokens(value: object) -> int | None:
    """``max_new_tokens`` (None: the frame budget) as a Python int from 1 to :data:`MAX_NEW_TOKENS`."""
    if value is None:
        return None
    n = whole(value, "max_new_tokens")
    if n < MIN_NEW_TOKENS:
        raise InvalidRequestError(f"max_new_tokens must be at least {MIN_NEW_TOKENS}", "max_new_tokens")
    if n > MAX_NEW_TOKENS:
        raise InvalidRequestError(f"max_new_tokens cannot exceed {MAX_NEW_TOKENS}", "max_new_tokens")
    return n


def resolved_max_new_tokens(text: str, max_new_tokens: int | None) -> int:
    """The frames a request may generate: its own ``max_new_tokens``, else :func:`frame_budget` of its text."""
    return frame_budget(text) if max_new_tokens is None else max_new_tokens


def fit_context(prompt_len: int, frames: int, context: int, *, explicit: bool) -> int:
    """``frames`` after a prompt of ``prompt_len`` positions, within ``context`` positions.

    A default budget shrinks to what fits; an explicit ``max_new_tokens`` that does not fit is the client's
    error (naming ``max_new_tokens``), and a prompt that leaves no room for speech names ``input``.
    """
    room = context - prompt_len
    if room < 1:
        raise InvalidRequestError(
            f"Input text too long: its prompt takes {prompt_len} of the model's {context} positions, "
            "leaving no room for speech; split it into several requests",
            "input",
        )
    if frames <= room:
        return frames
    if explicit:
        raise InvalidRequestError(
            f"max_new_tokens ({frames}) does not fit: the prompt takes {prompt_len} of the model's {context} "
            f"positions, leaving room for at most {room}",
            "max_new_tokens",
        )
    return room


def check_ref_seconds(seconds: float, param: str = "ref_audio") -> None:
    """Reference audio lasts :data:`MIN_REF_SECONDS` to :data:`MAX_REF_SECONDS` (vLLM-Omni's wording)."""
    if seconds < MIN_REF_SECONDS:
        raise InvalidRequestError(
            f"Reference audio too short ({seconds:.1f}s). At least {MIN_REF_SECONDS:.0f}s of clear speech is required.",
            param,
        )
    if seconds > MAX_REF_SECONDS:
        raise ref_too_long(f"{seconds:.1f}s", param)


def ref_too_long(length: str, param: str = "ref_audio") -> InvalidRequestError:
    """The error for reference audio over :data:`MAX_REF_SECONDS`; ``length`` as known (``"31.0s"``, or ``"more than
    31s"`` where decoding stopped at a bound without reading the rest)."""
    return InvalidRequestError(
        f"Reference audio too long ({length}). Maximum {MAX_REF_SECONDS:.0f}s supported — use a shorter clip.", param
    )


# An in-context clone's transcript: at most this many characters per second of its reference audio. Five times the
# fastest real speech (~20 a second): a clip cut mid-sentence may keep its sentence's transcript (the benchmarks'
# 1.5 s clips do), but a text past it is not this audio's (a pasted paragraph, the wrong file). Unchecked, such a
# request answered 200: its surplus ran, one token a frame, into the frames meant for ``input``.
MAX_REF_TEXT_CHARS_PER_SECOND = 100


def check_transcript(ref_text: str | None, seconds: float, param: str = "ref_text") -> None:
    """``ref_text``, the transcript of ``seconds`` of reference audio, is at most
    :data:`MAX_REF_TEXT_CHARS_PER_SECOND` characters a second long."""
    n = len((ref_text or "").strip())
    limit = int(MAX_REF_TEXT_CHARS_PER_SECOND * seconds)
    if n > limit:
        raise InvalidRequestError(
            f"ref_text too long for its reference audio ({n} characters for {seconds:.1f}s; at most {limit}): "
            "give the transcript of the reference audio, or set x_vector_only_mode to clone without one",
            param,
        )


def check_embedding(values: object, dim: int | None = None, param: str = "speaker_embedding") -> list[float]:
    """A speaker embedding: a non-empty list of finite numbers (``dim`` of them when given)."""
    import math

    if not isinstance(values, list | tuple) or not values:
        raise InvalidRequestError(f"'{param}' must be a non-empty list of numbers", param)
    if len(values) > MAX_EMBEDDING_DIM:
        raise InvalidRequestError(f"'{param}' exceeds maximum length ({MAX_EMBEDDING_DIM} elements)", param)
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise InvalidRequestError(f"'{param}' must contain only numeric values", param)
    out = [float(v) for v in values]
    if not all(math.isfinite(v) for v in out):
        raise InvalidRequestError(f"'{param}' values must be finite (no NaN or Inf)", param)
    if dim is not None and len(out) != dim:
        raise InvalidRequestError(
            f"'{param}' has {len(out)} values; this checkpoint's speaker embedding has {dim}", param
        )
    return out
