"""Log-probabilities of generated tokens, as a text stage reports them (OpenAI's ``logprobs.content`` entries)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One generated token: its text, natural-log probability under the model, and the ``top`` alternatives
    (text, log-probability), most likely first."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    def wire(self) -> dict[str, Any]:
        """OpenAI's ``choices[0].logprobs.content[i]``."""

        def entry(text: str, logprob: float) -> dict[str, Any]:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {**entry(self.token, self.logprob), "top_logprobs": [entry(t, lp) for t, lp in self.top]}
