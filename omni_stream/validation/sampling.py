"""Sampling fields in OpenAI's words, both ways: from a client's request, and to a backend that speaks them.

OpenAI's ``temperature`` 0 means greedy decoding, which :class:`~omni_stream.requests.SamplingParams` spells
``do_sample=False``; vLLM in process and OpenAI-compatible servers take the same fields (vLLM and SGLang also
``top_k`` and ``repetition_penalty``). A field at its default is not sent, so a plain server sees a plain body.
"""

from __future__ import annotations

from typing import Any

from omni_stream.requests import SamplingParams


def sampling_from_openai(
    temperature: float | None,
    top_p: float | None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
) -> SamplingParams | None:
    """A client's ``temperature`` and ``top_p`` (and vLLM's ``top_k``, -1 or 0 for none, and ``repetition_penalty``)
    as sampling parameters; None when it gave none of them (the model's defaults). ``temperature`` 0 is greedy (a
    repetition penalty still applies); the bounds are SamplingParams' own (errors name the field)."""
    if temperature is None and top_p is None and top_k is None and repetition_penalty is None:
        return None
    penalty = 1.0 if repetition_penalty is None else repetition_penalty
    if temperature == 0.0:
        return SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=penalty)
    return SamplingParams(
        do_sample=True,
        temperature=1.0 if temperature is None else temperature,
        top_k=0 if top_k is None or top_k == -1 else top_k,
        top_p=1.0 if top_p is None else top_p,
        repetition_penalty=penalty,
    )


def openai_sampling(sampling: SamplingParams) -> dict[str, Any]:
    """``sampling`` as the fields vLLM's ``SamplingParams`` and an OpenAI-compatible body take; defaults left out
    (``top_k`` 0 and ``top_p`` 1 filter nothing, ``repetition_penalty`` 1 changes nothing)."""
    fields: dict[str, Any] = {"temperature": 0.0}
    if sampling.do_sample:
        fields["temperature"] = sampling.temperature
        if sampling.top_p != 1.0:
            fields["top_p"] = sampling.top_p
        if sampling.top_k > 0:
            fields["top_k"] = sampling.top_k
    if sampling.repetition_penalty != 1.0:
        fields["repetition_penalty"] = sampling.repetition_penalty
    return fields
