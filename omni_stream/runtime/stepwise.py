"""Pipelines one model call at a time, batched across requests: each request's call runs in a greenlet.

A diffusers pipeline call runs every denoising step and the VAE decode in one loop, so as one job it would hold
the device for all of them, and requests that arrive while it runs could only start after it. We keep the
pipelines' own code (no forks) and cut it at its model calls instead: each request's work (a function that calls
the pipeline) runs in a greenlet of the device worker's thread, and the module calls named by :class:`Intercept`
(the denoiser's ``forward``, the VAE's ``decode``) *park* the greenlet: the call's arguments are handed to the
worker, which goes on with other work. One worker step (:meth:`StepwiseModel.step`) then makes one call for every
request parked at a compatible call (same model, equal arguments apart from the ``batched`` ones, which are
stacked along dim 0), splits the result by request and resumes each greenlet until its next model call. What runs
between two calls (the scheduler's update, a step callback's preview, the final post-processing) runs in that
resume, on the worker thread. So:

- a step is one batched model call (one denoising step, or one VAE decode), whatever the requests' progress:
  requests of one shape at different timesteps share the denoiser's call (per-row timesteps), and a request
  admitted now joins the batch at the next step (its text encoding and input latents run in its join step; the
  calls an adapter marks ``at_join`` are made once for all the requests joining together);
- the outputs are the pipeline's (its own loop runs, batch of one), as far as the model's kernels give the same
  rows in a batch as alone (bitwise on CPU for the tiny models);
- a request's state lives in its greenlet's frames between steps, and releasing it (:meth:`release`) kills the
  greenlet, which unwinds the pipeline and frees its latents before the next step.

Yield points: with ``yield_point`` (the device worker's), every block of an intercepted model (each element of
its ``ModuleList`` s: the denoiser's down, mid and up blocks or transformer blocks, the VAE decoder's blocks; and
each convolution) calls it before it runs, so realtime work that falls due during one large step runs between two
of its blocks. So do the blocks of the models a job runs between its calls (``also_yield``: the pipeline's text
encoders, :func:`text_encoders`): a join step encodes the prompt, and a video session's umT5 over 512 positions
is one of the longest pieces of device work between two realtime steps (113-136 ms of one join on the H200,
colocation runs 50 and 55) if nothing can run inside it.

Calls made outside these greenlets (a direct pipeline call, a test) pass through unchanged. Every request gets
its own copy of the pipeline object with its own noise scheduler (:func:`own_scheduler`): a pipeline keeps its
loop's state on itself (the scheduler's step index, ``_guidance_scale``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

import torch

from omni_stream.batch_model import Batch, SeqOutput
from omni_stream.batch_model import Sequence as Seq

log = logging.getLogger(__name__)

LOG_SIZE = 20_000
_SMALL = 1024  # elements: an unbatched tensor argument this small is compared by value (index tensors)

O = TypeVar("O")  # what a job hands out


def _merged(before: SeqOutput[tuple[O, ...]], after: SeqOutput[tuple[O, ...]]) -> SeqOutput[tuple[O, ...]]:
    """Two resumes of one job in one step as one output: the items of both, in order; the later one's end."""
    items = (before.item or ()) + (after.item or ())
    return SeqOutput(after.seq_id, items or None, before.finished or after.finished, after.error or before.error)


Emit = Callable[[O], None]
"""``Emit[O]``: hands an item out at the end of the step that made it."""


@dataclass(slots=True, frozen=True)
class Intercept:
    """A model call that parks the request making it: ``owner.method`` (``forward`` of a denoiser, ``decode`` of a
    VAE), logged as ``name``. ``batched``: the arguments stacked along dim 0 across requests (a 0-d tensor, a
    timestep, is expanded to the request's rows); every other argument must be equal for two calls to share one.
    Empty ``batched``: each request's calls run alone (still one call per step). ``fine``: yield points before
    every leaf module of ``owner``, not only its blocks and convolutions. ``at_join``: a call a request makes as it
    starts (its prompt's or its input's encoding): the requests starting together make it as one batched call
    inside their join step, so a newcomer still joins the running batch at the next step."""

    name: str
    owner: Any
    method: str
    batched: tuple[str, ...] = ()
    fine: bool = False  # yield points before every leaf module (a VAE: long elementwise passes at full size)
    at_join: bool = False


@dataclass(eq=False)
class StepJob(Generic[O]):
    """One request's work for :class:`StepwiseModel`: ``run(emit)`` runs in its own greenlet; ``emit(item)`` hands
    an item out at the end of the step that made it (a preview); ``run``'s return value, if not None, is the last
    item. ``label`` names it in the step log (a request id)."""

    label: str
    run: Callable[[Emit[O]], O | None]


@dataclass(slots=True, frozen=True)
class StepEvent:
    """One entry of the step log: ``kind`` is ``join`` (a job started), an intercept's name (a batched call),
    ``done`` or ``release``; ``labels`` the jobs it concerned."""

    seq: int
    kind: str
    labels: tuple[str, ...]


class StepLog:
    """The last :data:`LOG_SIZE` events of a :class:`StepwiseModel` (appended on the worker, read anywhere)."""

    def __init__(self, size: int = LOG_SIZE) -> None:
        self._events: deque[StepEvent] = deque(maxlen=size)
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def add(self, kind: str, labels: tuple[str, ...]) -> None:
        with self._lock:
            self._events.append(StepEvent(next(self._seq), kind, labels))

    def events(self) -> list[StepEvent]:
        with self._lock:
            return list(self._events)

    def of(self, label: str) -> list[StepEvent]:
        return [e for e in self.events() if label in e.labels]


class _Resume(Enum):
    VALUE = 0
    ERROR = 1


@dataclass(slots=True)
class _Park:
    """A model call a job is parked at: which intercept, its bound arguments, its rows, its grouping key."""

    intercept: int
    bound: inspect.BoundArguments
    rows: int
    key: Hashable
    ticket: int


@dataclass(slots=True, eq=False)
class _Running(Generic[O]):
    job: StepJob[O]
    greenlet: Any  # a greenlet.greenlet (imported when the model is made: an optional dependency)
    park: _Park | None = None
    items: list[O] = field(default_factory=list)


_DEVICE = "_omni_stream_execution_device"


@functools.cache
def _device_read_once(cls: type) -> type:
    """``cls`` with ``_execution_device`` read from the instance (set by :func:`own_scheduler`)."""

    def execution_device(self: Any) -> torch.device:
        return self.__dict__[_DEVICE]  # type: ignore[no-any-return]

    if cls.__dict__.get("_device_read_once"):  # a fork of a fork
        return cls
    members = {"_execution_device": property(execution_device), "_device_read_once": True, "__module__": cls.__module__}
    return type(cls.__name__, (cls,), members)


def own_scheduler(pipe: Any) -> Any:
    """A shallow copy of a diffusers pipeline (every model shared) with its own noise scheduler, whose execution
    device is the original's, read once: diffusers' ``_execution_device`` walks every module of every component for
    offloading hooks (none here: a pipeline stays where it was loaded), ~4 ms a call on a full-size pipeline, and a
    pipeline call reads it twice, on the worker's thread, in each request's join."""
    device = pipe.__dict__.get(_DEVICE)
    if device is None:
        device = pipe.__dict__[_DEVICE] = pipe._execution_device
    twin = copy.copy(pipe)
    twin.scheduler = copy.deepcopy(pipe.scheduler)
    twin.__class__ = _device_read_once(type(pipe))  # type: ignore[arg-type]  # a class is hashable
    twin.__dict__[_DEVICE] = device
    return twin


def hook_blocks(models: Sequence[Any], yield_point: Callable[[], None], *, fine: Sequence[Any] = ()) -> int:
    """Call ``yield_point`` before every block of ``models``, once each: every element of a ``ModuleList`` in them
    (blocks, layers) and every convolution; in ``fine`` models, every leaf module (a VAE decoder's norms and
    activations at full size take as long as its convolutions). Returns how many modules were hooked."""
    seen: set[int] = set()

    def hook(module: torch.nn.Module) -> None:
        if id(module) not in seen:
            seen.add(id(module))
            module.register_forward_pre_hook(lambda _module, _args: yield_point())

    for model in models:
        if not isinstance(model, torch.nn.Module):
            continue
        every = any(model is f for f in fine)
        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList):
                for block in module:
                    hook(block)
            elif isinstance(module, torch.nn.modules.conv._ConvNd) or (every and not any(module.children())):
                hook(module)
    return len(seen)


def text_encoders(pipe: Any) -> list[torch.nn.Module]:
    """A diffusers pipeline's text encoders (its components named ``text_encoder*``), which its jobs run between
    their model calls (the prompt's encoding in a join step)."""
    components = getattr(pipe, "components", None) or {}
    return [m for name, m in components.items() if name.startswith("text_encoder") and isinstance(m, torch.nn.Module)]


def _freeze(value: Any) -> Hashable:
    """A hashable stand-in for an unbatched argument: two calls share a batch only when these are equal."""
    if isinstance(value, torch.Tensor):
        if value.numel() <= _SMALL and value.device.type == "cpu":
            return ("tensor", tuple(value.shape), str(value.dtype), tuple(value.flatten().tolist()))
        return ("tensor-id", id(value))
    if value is None or isinstance(value, bool | int | float | str | Enum):
        return value
    if isinstance(value, tuple | list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    return ("id", id(value))


def _rows(value: Any, n: int) -> torch.Tensor:
    """A batched argument as ``n`` rows (a 0-d or one-row tensor is expanded)."""
    if value.ndim == 0:
        return value.reshape(1).expand(n)
    if value.shape[0] == n:
        return value
    if value.shape[0] == 1:
        return value.expand(n, *value.shape[1:])
    raise ValueError(f"a batched argument has {value.shape[0]} rows where the call has {n}")


def _split(out: Any, sizes: Sequence[int]) -> list[Any]:
    """A batched call's result, cut back into each request's rows (tensors, tuples of them, model outputs)."""
    total = sum(sizes)
    if isinstance(out, torch.Tensor):
        if out.ndim == 0 or out.shape[0] != total:
            return [out] * len(sizes)
        return list(out.split(list(sizes)))
    if isinstance(out, tuple | list):
        columns = [_split(v, sizes) for v in out]
        return [type(out)(column[i] for column in columns) for i in range(len(sizes))]
    if isinstance(out, dict):  # diffusers' BaseOutput (an OrderedDict dataclass)
        parts = {k: _split(v, sizes) for k, v in out.items()}
        return [type(out)(**{k: v[i] for k, v in parts.items()}) for i in range(len(sizes))]
    return [out] * len(sizes)


class StepwiseModel(Generic[O]):
    """A ``BatchModel[StepJob[O], tuple[O, ...]]``: its payloads are :class:`StepJob` s, and a step hands out what
    each job emitted in it (one tuple per job, None when it emitted nothing).

    A step with newcomers starts them (each runs up to its first model call), then makes their ``at_join`` calls
    (their prompts' and inputs' encoding), batched across them, until each waits at a call of the running batch; any
    other step makes one batched call, for the group of compatible parked calls holding the longest-parked one
    (so no group waits behind another for more than one round of them). ``on_call(kind, labels)`` (tests) runs on
    the worker after each call's requests have resumed; ``note(kind, labels)`` too (the worker's log).
    """

    def __init__(
        self,
        intercepts: Sequence[Intercept],
        *,
        max_batch_size: int = 32,
        note: Callable[[str, tuple[str, ...]], None] | None = None,
        guard: AbstractContextManager[Any] | None = None,
        yield_point: Callable[[], None] | None = None,
        also_yield: Sequence[Any] = (),
    ) -> None:
        """``guard`` (the worker's lock) is held while a step picks its jobs and logs them, so that a release
        logged under it is never followed by a step of that job in the log. ``yield_point``: called before every
        block of the intercepted models and of ``also_yield`` (the module docstring)."""
        import greenlet

        self._greenlet = greenlet
        self._max_batch_size = max(1, max_batch_size)
        self.intercepts = list(intercepts)
        self._originals: list[Callable[..., Any]] = []
        self._signatures: list[inspect.Signature] = []
        self._by_greenlet: dict[Any, _Running[O]] = {}
        self._tickets = itertools.count()
        self.log = StepLog()
        self.note = note
        self.on_call: Callable[[str, tuple[str, ...]], None] | None = None
        self.calls = 0
        self._guard = guard if guard is not None else nullcontext()
        self._calling: tuple[str, ...] = ()
        for index, spec in enumerate(self.intercepts):
            original = getattr(spec.owner, spec.method)
            self._originals.append(original)
            self._signatures.append(inspect.signature(original))
            setattr(spec.owner, spec.method, self._interceptor(index, original))
        if yield_point is not None:
            owners = [spec.owner for spec in self.intercepts]
            hook_blocks([*owners, *also_yield], yield_point, fine=[spec.owner for spec in self.intercepts if spec.fine])

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def running(self) -> int:
        """Jobs started and not finished (worker thread; tests read it once idle)."""
        return len(self._by_greenlet)

    def current(self) -> str | None:
        """The label of the job whose greenlet runs now (None outside jobs; worker thread)."""
        running = self._by_greenlet.get(self._greenlet.getcurrent())
        return None if running is None else running.job.label

    def current_call(self) -> tuple[str, ...]:
        """The labels of the jobs whose batched call runs now (empty between calls; worker thread)."""
        return self._calling

    def _record(self, kind: str, labels: tuple[str, ...]) -> None:
        self.log.add(kind, labels)
        if self.note is not None:
            self.note(kind, labels)

    # --- inside a job's greenlet ---

    def _interceptor(self, index: int, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            running = self._by_greenlet.get(self._greenlet.getcurrent())
            if running is None:  # not a job's call (a direct pipeline call, a preview fit at load)
                return original(*args, **kwargs)
            return self._park(running, index, args, kwargs)

        return call

    def _park(self, running: _Running[O], index: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        spec = self.intercepts[index]
        bound = self._signatures[index].bind(*args, **kwargs)
        rows, shapes = 0, list[Hashable]()
        for name in spec.batched:
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor):
                if value.ndim > 0 and not rows:
                    rows = int(value.shape[0])
                shapes.append((name, tuple(value.shape[1:]) if value.ndim else "scalar", str(value.dtype)))
            else:
                shapes.append((name, _freeze(value)))
        shared = tuple((k, _freeze(v)) for k, v in bound.arguments.items() if k not in spec.batched)
        key: Hashable = (index, tuple(shapes), shared) if spec.batched else (index, id(running))
        running.park = _Park(index, bound, max(rows, 1), key, next(self._tickets))
        kind, value = running.greenlet.parent.switch(running.park)
        if kind is _Resume.ERROR:
            raise value
        return value

    # --- the worker thread ---

    def step(self, batch: Batch[StepJob[O]]) -> list[SeqOutput[tuple[O, ...]]]:
        grad = torch.is_grad_enabled()
        try:
            with torch.no_grad():
                if batch.prefill:
                    with self._guard:
                        joining = [seq for seq in batch.prefill if not seq.abort_requested]
                        for seq in joining:
                            self._record("join", (seq.payload.label,))
                    return self._start_all(joining)
                return self._call_group(batch.decode)
        finally:
            torch.set_grad_enabled(grad)  # a parked pipeline left its no_grad() open on this thread

    def _start_all(self, joining: Sequence[Seq[StepJob[O]]]) -> list[SeqOutput[tuple[O, ...]]]:
        """Start each newcomer, then make their ``at_join`` calls, batched, until each is parked at a call of the
        running batch (or done)."""
        outputs = {seq.seq_id: self._start(seq) for seq in joining}
        while True:
            starting = [
                seq
                for seq in joining
                if not seq.abort_requested
                and isinstance(running := seq.model_state, _Running)
                and running.park is not None
                and self.intercepts[running.park.intercept].at_join
            ]
            if not starting:
                return list(outputs.values())
            for out in self._call_group(starting):
                outputs[out.seq_id] = _merged(outputs[out.seq_id], out)

    def _start(self, seq: Seq[StepJob[O]]) -> SeqOutput[tuple[O, ...]]:
        job = seq.payload
        running = _Running(job, None)
        running.greenlet = self._greenlet.greenlet(lambda: job.run(lambda item: running.items.append(item)))
        seq.model_state = running
        self._by_greenlet[running.greenlet] = running
        return self._resume(seq, running, None)

    def _resume(
        self, seq: Seq[StepJob[O]], running: _Running[O], value: tuple[_Resume, Any] | None
    ) -> SeqOutput[tuple[O, ...]]:
        running.park = None
        try:
            result = running.greenlet.switch() if value is None else running.greenlet.switch(value)
        except Exception as exc:  # the job failed: it alone
            self._forget(running)
            return SeqOutput(seq.seq_id, self._take(running), error=exc)
        if running.greenlet.dead:
            self._forget(running)
            if result is not None:
                running.items.append(result)
            self._record("done", (running.job.label,))
            return SeqOutput(seq.seq_id, self._take(running), finished=True)
        return SeqOutput(seq.seq_id, self._take(running))

    @staticmethod
    def _take(running: _Running[O]) -> tuple[O, ...] | None:
        items, running.items = running.items, []
        return tuple(items) if items else None

    def _forget(self, running: _Running[O]) -> None:
        self._by_greenlet.pop(running.greenlet, None)

    def _call_group(self, decode: Sequence[Seq[StepJob[O]]]) -> list[SeqOutput[tuple[O, ...]]]:
        parked = [(s, r, r.park) for s in decode if isinstance(r := s.model_state, _Running) and r.park is not None]
        if not parked:
            return []
        with self._guard:  # a job released from now on is not in this call's log entry, nor in the call
            parked = [p for p in parked if not p[0].abort_requested]
            if not parked:
                return []
            first = min(parked, key=lambda p: p[2].ticket)[2]
            group = [p for p in parked if p[2].key == first.key]
            spec = self.intercepts[first.intercept]
            labels = tuple(r.job.label for _, r, _ in group)
            self._record(spec.name, labels)
        parks = [park for _, _, park in group]
        self.calls += 1
        self._calling = labels
        try:
            results = self._batched_call(parks)
        except Exception as exc:  # the call failed: every request of it fails, at its parked call
            resumes = [(_Resume.ERROR, exc)] * len(group)
        else:
            resumes = [(_Resume.VALUE, r) for r in results]
        finally:
            self._calling = ()
        if self.note is not None:  # the worker's log: what follows is the requests' own work (schedulers, previews)
            self.note("requests", labels)
        outputs = [
            self._resume(seq, running, value)
            for (seq, running, _), value in zip(group, resumes, strict=True)
            if not seq.abort_requested  # released during the call: its release kills it before the next step
        ]
        if self.on_call is not None:
            self.on_call(spec.name, labels)
        return outputs

    def _batched_call(self, parks: Sequence[_Park]) -> list[Any]:
        index = parks[0].intercept
        spec, original = self.intercepts[index], self._originals[index]
        first = parks[0].bound
        if len(parks) == 1:
            return [original(*first.args, **first.kwargs)]
        merged = self._signatures[index].bind(*first.args, **first.kwargs)
        sizes = [p.rows for p in parks]
        for name in spec.batched:
            values = [p.bound.arguments.get(name) for p in parks]
            if all(isinstance(v, torch.Tensor) for v in values):
                merged.arguments[name] = torch.cat([_rows(v, n) for v, n in zip(values, sizes, strict=True)])
        return _split(original(*merged.args, **merged.kwargs), sizes)

    def release(self, seq: Seq[StepJob[O]]) -> None:
        """Kill the job's greenlet (its pipeline unwinds; its tensors are freed) unless it has finished."""
        running = seq.model_state
        seq.model_state = None
        if not isinstance(running, _Running):
            return
        self._forget(running)
        if running.greenlet is not None and not running.greenlet.dead:
            self._record("release", (running.job.label,))
            grad = torch.is_grad_enabled()
            try:
                running.greenlet.throw(self._greenlet.GreenletExit)
            except Exception:
                log.exception("job %s failed while it was released", running.job.label)
            finally:
                torch.set_grad_enabled(grad)
