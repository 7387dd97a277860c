"""Log-probabilities of generated tokens, as a text stage reports them (OpenAI's ``logprobs.content`` entries)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One generated token: its text, natural-log probability under the model, and the ``top`` alternatives
    (text, log-probability), most likely first. ``raw`` / ``top_raw``: the bytes each token stands for, where the
    backend knows them (a token that is part of a character, whose text alone is U+FFFD); else its text's UTF-8."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()
    raw: bytes | None = None
    top_raw: tuple[bytes | None, ...] = ()

    def wire(self) -> dict[str, Any]:
        """OpenAI's ``choices[0].logprobs.content[i]``."""

        def entry(text: str, logprob: float, raw: bytes | None) -> dict[str, Any]:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8") if raw is None else raw)}

        raws: tuple[bytes | None, ...] = self.top_raw if len(self.top_raw) == len(self.top) else (None,) * len(self.top)
        top = [entry(t, lp, raw) for (t, lp), raw in zip(self.top, raws, strict=True)]
        return {**entry(self.token, self.logprob, self.raw), "top_logprobs": top}
