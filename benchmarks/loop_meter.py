"""What runs on an asyncio event loop, and for how long: every callback the loop runs (a task's step, a
``call_soon`` callback, a transport's data) timed in wall and in thread CPU time, named by what it runs, and, while
one runs past ``sample_after`` seconds, samples of the loop thread's stack (a thread that reads
``sys._current_frames()``), so a long callback is named by the code inside it, not only by its task.

Used by ``benchmarks/health_load.py`` (what holds the loop of a server under load) and by the load test
(``tests/test_health_load.py``). Install it on the loop to watch, from that loop's thread::

    meter = LoopMeter(sample_after=0.02)
    meter.install()      # in the loop's thread: only that thread's callbacks are measured
    ...
    report = meter.report()
    meter.uninstall()

Measuring wraps ``asyncio.Handle._run`` process-wide (other threads' loops pass through unmeasured); it adds about
a microsecond a callback. Callbacks longer than ``keep_after`` are also kept one by one on a timeline (their start
on ``time.monotonic()``'s clock, which on Linux is every process's ``CLOCK_MONOTONIC``), so a benchmark can say what
a loop ran inside one window (a scenario's first second), in its own process or in its server's
(:func:`window`).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

_original_run = asyncio.events.Handle._run
_meters: list[LoopMeter] = []
_audit_hooked = False


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "import" and _meters:
        for meter in _meters:
            meter._on_import(str(args[0]))
    elif event == "open" and _meters:
        for meter in _meters:
            meter._on_open(str(args[0]))


def label(handle: asyncio.Handle) -> str:
    """What a handle runs: a task's coroutine (qualified name), else the callback's name."""
    callback = getattr(handle, "_callback", None)
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return f"task {getattr(coro, '__qualname__', type(coro).__name__)}"
    return getattr(callback, "__qualname__", None) or type(callback).__name__


@dataclass
class LoopMeter:
    """See the module docstring. Durations in seconds; ``sample_every``: the sampler's period."""

    sample_after: float = 0.02
    sample_every: float = 0.002
    own_frames: tuple[str, ...] = ("omni_stream", "realtime", "codecs")  # stack frames worth naming first
    callbacks: int = 0
    wall: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    samples: Counter[str] = field(default_factory=Counter)
    stall_after: float = 0.05  # a heartbeat (a loop callback every ``sample_every``) this late is a stall
    stalls: list[dict[str, Any]] = field(default_factory=list)
    collections: list[dict[str, Any]] = field(default_factory=list)  # garbage collections over 5 ms
    imports: list[dict[str, Any]] = field(default_factory=list)  # modules first imported on the loop's thread
    opened: Counter[str] = field(default_factory=Counter)  # files opened on the loop's thread, by where
    torch_calls: Counter[str] = field(default_factory=Counter)  # torch functions called on the loop's thread
    keep_after: float = 0.001  # callbacks at least this long go on the timeline too
    timeline_cap: int = 20000
    timeline: list[dict[str, Any]] = field(default_factory=list)  # {"at": monotonic s, "what", "ms", "cpu_ms"}
    # The running loop's class, and whether its callbacks pass through asyncio's Handle._run: uvloop's (uvicorn's
    # choice where it is installed, as on the GPU machines) run in C, so a meter there would count nothing.
    loop: str = ""
    measurable: bool = True
    _gc_started: float | None = None
    _installed: float = 0.0
    _beat: float | None = None
    _thread: int | None = None
    _started: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    def install(self) -> None:
        """Measure the calling thread's loop from now on."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # installed before the loop runs: its callbacks will be asyncio's
            running = None
        if running is not None:
            self.loop = f"{type(running).__module__}.{type(running).__qualname__}"
            self.measurable = isinstance(running, asyncio.BaseEventLoop)
        self._thread = threading.get_ident()
        self._installed = time.perf_counter()
        mono = time.monotonic() - time.perf_counter()  # the timeline's clock, from perf_counter's
        meter = self

        def run(handle: asyncio.Handle) -> None:
            if threading.get_ident() != meter._thread:
                _original_run(handle)
                return
            meter._started = start = time.perf_counter()
            cpu = time.thread_time()
            try:
                _original_run(handle)
            finally:
                meter._started = None
                if meter._beat is None:  # the first callback of the loop: the heartbeat starts
                    meter.beat()
                name = label(handle)
                meter.callbacks += 1
                took, took_cpu = time.perf_counter() - start, time.thread_time() - cpu
                meter.wall[name].append(took)
                meter.cpu[name].append(took_cpu)
                if took >= meter.keep_after and len(meter.timeline) < meter.timeline_cap:
                    meter.timeline.append(
                        {"at": start + mono, "what": name, "ms": took * 1e3, "cpu_ms": took_cpu * 1e3}
                    )

        asyncio.events.Handle._run = run  # type: ignore[method-assign]
        gc.callbacks.append(self._on_gc)
        global _audit_hooked
        if not _audit_hooked:
            _audit_hooked = True
            sys.addaudithook(_on_audit)  # hooks cannot be removed: one for the process, reporting to the meter
        _meters.append(self)
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, name="loop-meter", daemon=True)
        self._sampler.start()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # A collection holds the interpreter lock for its whole pass, in whichever thread allocated.
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            took = time.perf_counter() - self._gc_started
            if took > 0.005:
                on_loop = threading.get_ident() == self._thread
                self.collections.append(
                    {
                        "generation": info["generation"],
                        "ms": took * 1e3,
                        "collected": info["collected"],
                        "on_loop": on_loop,
                        "at_s": time.perf_counter() - self._installed,
                    }
                )

    def reset(self) -> None:
        """Forget what was measured so far (e.g. the start-up), from any thread; measuring goes on."""
        self._installed = time.perf_counter()
        for table in (self.wall, self.cpu, self.samples, self.opened, self.torch_calls):
            table.clear()
        for events in (self.stalls, self.collections, self.imports, self.timeline):
            events.clear()
        self.callbacks = 0

    def _on_import(self, module: str) -> None:
        if threading.get_ident() != self._thread or self._stop.is_set():
            return
        where = self._where(sys._getframe(3))
        self.imports.append({"module": module, "at_s": time.perf_counter() - self._installed, "where": where})

    def _on_open(self, path: str) -> None:
        if threading.get_ident() == self._thread and not self._stop.is_set():
            self.opened[f"{path} < {self._where(sys._getframe(3))}"] += 1

    def watch_torch(self) -> Any:
        """A torch function mode that counts torch calls made on this thread (enter it in the loop's thread)."""
        from torch.overrides import TorchFunctionMode

        meter = self

        class Count(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if threading.get_ident() == meter._thread:
                    meter.torch_calls[f"{getattr(func, '__name__', func)} < {meter._where(sys._getframe(1))}"] += 1
                return func(*args, **(kwargs or {}))

        return Count()

    def uninstall(self) -> None:
        if self in _meters:
            _meters.remove(self)
        asyncio.events.Handle._run = _original_run  # type: ignore[method-assign]
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=5)

    def beat(self) -> None:
        """Schedule the heartbeat on the running loop (call it from the loop's thread, once it runs)."""
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self._beat = time.perf_counter()
            if not self._stop.is_set():
                loop.call_later(self.sample_every, tick)

        tick()

    def _stalled(self, now: float) -> None:
        """The heartbeat is late: what every other thread was running, innermost frames first."""
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        threads = {}
        for ident, frame in frames.items():
            if ident == threading.get_ident():
                continue
            threads[names.get(ident, str(ident))] = self._where(frame)
        late = (now - (self._beat or now)) * 1e3
        self.stalls.append({"late_ms": late, "at_s": now - self._installed, "threads": threads})

    def _sample(self) -> None:
        stalled_at = None
        while not self._stop.wait(self.sample_every):
            now = time.perf_counter()
            beat = self._beat
            if beat is not None and now - beat > self.stall_after:
                if stalled_at != beat and len(self.stalls) < 200:  # one snapshot per stall
                    stalled_at = beat
                    self._stalled(now)
            started = self._started
            if started is None or time.perf_counter() - started < self.sample_after or self._thread is None:
                continue
            frame = sys._current_frames().get(self._thread)
            if frame is not None:
                self.samples[self._where(frame)] += 1

    def _where(self, frame: Any) -> str:
        """The innermost frame of this package (and the innermost frame of all), as ``file:line function``
        (read from the frames alone: no source lines, so no file is opened)."""
        stack = []
        while frame is not None:
            stack.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
            frame = frame.f_back

        def show(f: tuple[str, int, str]) -> str:
            return f"{f[0].rsplit('/', 1)[-1]}:{f[1]} {f[2]}"

        ours = next((f for f in stack if any(f"/{part}/" in f[0] for part in self.own_frames)), None)
        name = show(stack[0]) if stack else "?"
        return f"{show(ours)} > {name}" if ours is not None and ours is not stack[0] else name

    def longest(self, n: int = 10, cpu: bool = False, by: str = "max_ms") -> list[dict[str, Any]]:
        """The ``n`` callback kinds with the longest single run (``by="max_ms"``) or the most time in all
        (``"total_ms"``), in wall or thread CPU time."""
        table = self.cpu if cpu else self.wall
        rows = [{"what": k, "max_ms": max(v) * 1e3, "total_ms": sum(v) * 1e3, "runs": len(v)} for k, v in table.items()]
        return sorted(rows, key=lambda r: -r[by])[:n]

    def over(self, seconds: float, cpu: bool = True) -> int:
        """How many callbacks ran longer than ``seconds`` (thread CPU time by default: the loop's own work, not
        the time other threads held the interpreter while it waited for it)."""
        table = self.cpu if cpu else self.wall
        return sum(1 for runs in table.values() for t in runs if t > seconds)

    def report(self, n: int = 10, timeline: bool = False) -> dict[str, Any]:
        """The longest and busiest callbacks, samples, stalls and the rest; ``timeline``: the kept callbacks too."""
        return {
            "loop": self.loop,
            "measurable": self.measurable,
            "callbacks": self.callbacks,
            "longest_wall": self.longest(n),
            "longest_cpu": self.longest(n, cpu=True),
            "busiest_cpu": self.longest(n, cpu=True, by="total_ms"),
            "loop_cpu_s": sum(sum(v) for v in self.cpu.values()),
            "sampled_inside_long_callbacks": [{"where": w, "samples": c} for w, c in self.samples.most_common(n)],
            "stalls": self.stalls,
            "collections_over_5ms": self.collections,
            "imports_on_loop": self.imports,
            "files_opened_on_loop": [{"what": w, "times": c} for w, c in self.opened.most_common(n)],
            "torch_calls_on_loop": [{"what": w, "calls": c} for w, c in self.torch_calls.most_common(n)],
        } | ({"timeline": list(self.timeline)} if timeline else {})


def window(report: dict[str, Any], start: float, end: float | None, top: int = 5) -> dict[str, Any]:
    """What a loop ran from ``start`` to ``end`` (``time.monotonic()`` times) by its report's timeline: the time
    its kept callbacks (each over ``keep_after``) held it, how many, and the longest, each at its offset from
    ``start``. Empty when the loop was not measured or the window is empty."""
    if not report.get("measurable", True) or end is None or end <= start:
        return {}
    inside = [c for c in report.get("timeline", []) if start <= c["at"] < end]
    busy: Counter[str] = Counter()
    for c in inside:
        busy[c["what"]] += c["ms"]
    longest = [{"what": c["what"], "ms": round(c["ms"], 1), "at_ms": round(1e3 * (c["at"] - start), 1)}
               for c in sorted(inside, key=lambda c: -c["ms"])[:top]]  # fmt: skip
    return {
        "window_ms": round(1e3 * (end - start), 1),
        "held_ms": round(sum(c["ms"] for c in inside), 1),
        "callbacks": len(inside),
        "by_what_ms": {k: round(v, 1) for k, v in busy.most_common(top)},
        "longest": longest,
    }


def window_line(name: str, held: dict[str, Any]) -> str:
    """:func:`window` in one line."""
    if not held:
        return f"    {name} loop: not measured in the window"
    longest = ", ".join(f"{c['what']} {c['ms']:.0f} ms at +{c['at_ms']:.0f}" for c in held["longest"][:3])
    return (f"    {name} loop until the last first audio ({held['window_ms']:.0f} ms): held {held['held_ms']:.0f} ms "
            f"by {held['callbacks']} callbacks over 1 ms; longest: {longest or '-'}")  # fmt: skip
