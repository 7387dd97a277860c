"""Streaming TTS under open-loop load: Poisson arrivals at fixed rates, over HTTP, WebSocket or in process.

Requests arrive as a Poisson process of ``--rates`` requests a second for ``--duration`` seconds each, whether or
not earlier ones have finished (open loop: what users produce, against the bursts of ``tts_bench.py``). Each is
one utterance of a length drawn for it (``--lengths``: ``LO-HI`` seconds uniformly, EOS suppressed at the drawn
length, the text ~14 characters a second; or ``S``: every request S seconds of the burst benchmark's sentence, for
comparison with the bursts), in each ``--voice-mode`` of ``tts_clients.py`` (CustomVoice built-in voices, or on a
Base checkpoint reference audio with each request, in context or x-vector only, or voices uploaded once). The
arrival times and lengths depend only on ``--seed`` and the rate, so every transport, mode and arm meets the same
schedule.

Per rate: time to first audio p50 / p95 / p99 (HTTP: from the request's send, connections kept alive in one pool;
WebSocket: every request opens its session at its arrival, TTFA from its ``input.text``, and ``ttfa_arrival`` from
the arrival, the connection and ``session.config`` included), the share of requests with any underrun (a player
starting at the first chunk waits at least once) and with continuity OK (worst wait under 100 ms), audio seconds
delivered per second against those offered, requests in flight, and the engine's live batch over time: every
``--sample-ms`` the talker's running / waiting / paused sequences and the mean batch of the steps since the last
sample (over the server from ``/metrics``; in process from the scheduler), with the client's own count of requests
in flight at the same moments. In process it adds what the worker spent (``tts_bench.StepTimer``: steps holding
newcomers against steps of running rows alone, voice-prompt extractions; the worker's log summed per piece of work)
and where each first audio went (:func:`first_audio_split`: the wait for the talker call that admitted the request,
that call, and what came after it).

``--arm NAME:VAR=VALUE[,...]`` (repeatable) runs everything once per arm on its own server (or engine), the
variables (or ``serve`` flags, ``--flag=VALUE``) set for it, so a switch's on and off are measured in one call
against the same arrivals; results are tagged ``_NAME``. ``--retune NAME:field=value[,...]`` (in process) gives
arms that take turns at each rate on one engine (``Qwen3TTSFamily.retune``: the talker's tuning fields), and
``--bursts`` runs ``tts_bench.py``'s burst levels on the same server or engine after the open loop.

Writes ``tts_load_<size>[-<mode>]_<lengths>[_<arm>]_<transport>.json`` under ``$OUT`` (else
``benchmarks/results``); ``--summarize`` prints a table of every such file there and plots TTFA p95 (and p50),
delivered audio and the underrun share against the rate (``tts_load.png``).

GPU (the wheels of ``tts_bench.py``; ~15 s a rate plus its drain)::

    python3 benchmarks/tts_load.py --size 1.7b --transport http,ws --rates 5,10,20,40,80 --duration 15

CPU smoke run (tests/test_tts_load_cpu.py): ``--tiny --device cpu --rates 2,4 --duration 2 --lengths 0.4-0.8``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tts_bench import (
    CONTINUITY_S,
    Driver,
    StepTimer,
    base_result,
    free_port,
    load_engine,
    mode_tag,
    out_dir,
    served_name,
    server_process,
    server_stats,
    wait_healthy,
    write_checkpoint,
)
from tts_bench import drive as drive_bursts
from tts_clients import (
    FRAME_S,
    TEXT,
    VOICE_MODES,
    RequestFields,
    Spoken,
    http_request,
    inproc_request,
    mode_kind,
    text_for,
    ws_request,
)

from omni_stream.metrics import percentile
from omni_stream.runtime.work_profile import work_profile

TRANSPORTS = ("inproc", "http", "ws")
WARMUP_FRAMES = 12


@dataclass(frozen=True, slots=True)
class Lengths:
    """Request lengths: uniform in ``[lo, hi]`` seconds, or every one ``lo`` seconds when ``lo == hi``."""

    lo: float
    hi: float

    @classmethod
    def parse(cls, spec: str) -> Lengths:
        lo, _, hi = spec.partition("-")
        a, b = float(lo), float(hi or lo)
        if not 0 < a <= b:
            raise ValueError(f"lengths must be S or LO-HI seconds with 0 < LO <= HI, got {spec!r}")
        return cls(a, b)

    @property
    def fixed(self) -> bool:
        return self.lo == self.hi

    @property
    def tag(self) -> str:
        return f"{self.lo:g}s" if self.fixed else f"{self.lo:g}-{self.hi:g}s"


def schedule(rate: float, duration: float, lengths: Lengths, seed: int) -> list[tuple[float, Spoken]]:
    """Poisson arrivals (seconds after the start) of ``rate`` a second over ``duration`` s, each with its request;
    the same for every transport, mode and arm (seeded by ``seed`` and the rate alone)."""
    rng = np.random.default_rng([seed, round(rate * 1000)])
    times, t = [], float(rng.exponential(1 / rate))
    while t < duration:
        times.append(t)
        t += float(rng.exponential(1 / rate))
    out = []
    for i, at in enumerate(times):
        seconds = lengths.lo if lengths.fixed else float(rng.uniform(lengths.lo, lengths.hi))
        frames = max(2, round(seconds / FRAME_S))
        out.append((at, Spoken(i, TEXT if lengths.fixed else text_for(seconds), frames)))
    return out


class Transport:
    """One request over one transport, and the engine's live state (for the timeline)."""

    def __init__(
        self,
        name: str,
        fields: RequestFields,
        samples_per_frame: int,
        *,
        engine=None,
        timer: StepTimer | None = None,
        url: str = "",
        client=None,
    ) -> None:
        """``client``: the HTTP requests' pool (and the metrics'); ``timer``: the worker's wall times (in process)."""
        self.name, self.fields, self.samples_per_frame = name, fields, samples_per_frame
        self.engine, self.timer, self.url, self.client = engine, timer, url, client

    async def request(self, spoken: Spoken) -> dict:
        if self.name == "inproc":
            return await inproc_request(self.engine, spoken, self.fields)
        if self.name == "http":
            return await http_request(self.client, self.url, spoken, self.fields)
        return await ws_request("ws" + self.url.removeprefix("http"), spoken, self.fields)

    async def counters(self) -> dict[str, float]:
        """The talker's queue gauges and its step and batch-size sums and counts, now."""
        if self.name == "inproc":
            sched = self.engine.models.speech().scheduler
            live, stats = sched.live(), sched.stats
            return {"requests_running": live["running"], "requests_waiting": live["waiting"],
                    "requests_paused": 0.0, "batch_size_sum": stats.items, "batch_size_count": stats.steps,
                    "step_seconds_sum": stats.model_seconds, "step_seconds_count": stats.steps}  # fmt: skip
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        for attempt in range(3):
            try:
                text = (await self.client.get(f"{self.url}/metrics")).text
                break
            except httpx.TransportError:
                # A pooled connection the server closed as it was reused: at 80 requests/s over HTTP (run 30) one
                # poll got "Server disconnected without sending a response" and ended the whole run. Ask again.
                if attempt == 2:
                    raise
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removeprefix("omni_stream_")
                if sample.labels.get("scheduler") == "talker" or name.startswith(("ttfa_seconds", "queue_seconds")):
                    out[name] = sample.value
        return out


async def sample_engine(transport: Transport, t0: float, every: float, stop: asyncio.Event, into: list) -> None:
    """Every ``every`` s until ``stop``: the talker's live sequences and the mean batch of the steps since the last
    sample (a timed wait on ``stop``: this samples a clock, it waits for nothing)."""
    last = await transport.counters()
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every)
            done = True
        except TimeoutError:
            done = False
        now = await transport.counters()
        steps = now.get("batch_size_count", 0.0) - last.get("batch_size_count", 0.0)
        model_s = now.get("step_seconds_sum", 0.0) - last.get("step_seconds_sum", 0.0)
        into.append({
            "t": time.perf_counter() - t0,
            "running": now.get("requests_running"),
            "waiting": now.get("requests_waiting"),
            "paused": now.get("requests_paused"),
            "steps": int(steps),
            "batch_mean": (now.get("batch_size_sum", 0.0) - last.get("batch_size_sum", 0.0)) / steps if steps else 0.0,
            "step_ms_mean": 1000 * model_s / steps if steps else None,
        })  # fmt: skip
        last = now
        if done:
            return


async def run_rate(transport: Transport, rate: float, args: argparse.Namespace, lengths: Lengths) -> dict:
    """Every arrival of one rate, each sent at its time; waits for the last to finish; the level's figures."""
    plan = schedule(rate, args.duration, lengths, args.seed)
    before = await transport.counters()
    timeline: list[dict] = []
    stop = asyncio.Event()
    records: list[dict] = []
    lags: list[float] = []

    async def one(at: float, spoken: Spoken) -> None:
        try:
            record = await transport.request(spoken)
        except Exception as exc:  # an overloaded server may fail some: count them, keep the run
            record = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        records.append(record | {"arrival": at, "frames": spoken.frames, "index": spoken.index})

    t0 = time.perf_counter()
    sampler = asyncio.create_task(sample_engine(transport, t0, args.sample_ms / 1000, stop, timeline))
    tasks = []
    for at, spoken in plan:
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # the arrival's scheduled time: open loop, independent of earlier requests
        lags.append(time.perf_counter() - t0 - at)
        tasks.append(asyncio.create_task(one(at, spoken)))
    await asyncio.gather(*tasks)
    stop.set()
    await sampler
    ended = time.perf_counter()
    after = await transport.counters()
    level = summarize_rate(rate, args.duration, records, lags, t0, transport.samples_per_frame)
    for point in timeline:  # the client's own count of requests in flight at each sample
        at = t0 + point["t"]
        point["in_flight"] = sum(1 for r in records if "start" in r and r["start"] <= at < r["end"])
    level["timeline"] = timeline
    # Every request: [arrival s, frames, TTFA ms, underrun ms, end s after the level's start] (None where it failed).
    level["requests_detail"] = [
        [round(r["arrival"], 4), r["frames"]]
        + ([round(1000 * r["ttfa"], 2), round(1000 * r["underrun"], 2), round(r["end"] - t0, 4)]
           if "error" not in r else [None, None, None])
        for r in sorted(records, key=lambda r: r["index"])
    ]  # fmt: skip
    if transport.engine is not None and transport.engine.worker.record:  # in process: the worker's time, by work
        # a copy first: the worker thread appends to its log meanwhile (list() of a deque is one step under the GIL)
        level["work"] = work_profile(list(transport.engine.worker.log), t0, ended).summary()
    if transport.timer is not None:
        level["first_audio_split"] = first_audio_split(records, transport.timer.admitted)
        level.update(transport.timer.summary(-1))
        transport.timer.reset()
        family = transport.engine.models.speech()
        level["talker"] = {"step_ahead": family.runner.ahead, "admit_after_collect": family.scheduler.settles,
                           "first_window_wait_ms": 1000 * family.scheduler.due_wait,
                           "prefill_budget": family.runner.prefill_budget,
                           "voice_cache": family.voice_cache.size if family.voice_cache is not None else 0}  # fmt: skip
    else:
        level.update(server_stats(before, after))
    return level


FIRST_AUDIO_PARTS = ("to_admitting_call", "admitting_call", "after_it")


def first_audio_split(records: list[dict], admitted: dict[str, tuple[float, float]]) -> dict:
    """In process: each request's first audio in three consecutive parts (ms): from its call to the talker call that
    admitted it (the steps in flight before it, its prompt's preparation, the loop), that call's wall time on the
    worker (stepping ahead: launching it and collecting the step before), and from that call's end to the first
    audio (the device's work on it, the step that brings its first frame, its first window, the channels). p50 and
    p95 of each, and their means over the slowest 5 % of first audios (what a p95 is made of)."""
    rows = []
    for r in records:
        call = admitted.get(r.get("request_id", ""))
        if call is None or "ttfa" not in r:
            continue
        begin, end, first = call[0], call[1], r["start"] + r["ttfa"]
        rows.append((1000 * r["ttfa"], (1000 * (begin - r["start"]), 1000 * (end - begin), 1000 * (first - end))))
    if not rows:
        return {"requests": 0}
    rows.sort(key=lambda row: row[0])
    slowest = rows[-max(1, round(0.05 * len(rows))) :]
    out: dict = {"requests": len(rows)}
    for i, part in enumerate(FIRST_AUDIO_PARTS):
        values = [parts[i] for _, parts in rows]
        out[part] = {"p50": round(percentile(values, 50), 2), "p95": round(percentile(values, 95), 2),
                     "slowest_5pct_mean": round(statistics.fmean(parts[i] for _, parts in slowest), 2)}  # fmt: skip
    return out


def summarize_rate(
    rate: float, duration: float, records: list[dict], lags: list[float], t0: float, samples_per_frame: int
) -> dict:
    ok = [r for r in records if "error" not in r]
    failed = [r for r in records if "error" in r]
    level: dict = {
        "rate": rate,
        "duration_s": duration,
        "requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({r["error"] for r in failed})[:3],
        "send_lag_ms_p99": 1000 * percentile(lags, 99) if lags else None,
        "offered_audio_s_per_s": sum(r["frames"] for r in records) * FRAME_S / duration,
        "audio_s_per_request_mean": statistics.fmean(r["frames"] for r in records) * FRAME_S if records else None,
    }
    if not ok:
        return level
    ttfa = [r["ttfa"] for r in ok]
    und = [r["underrun"] for r in ok]
    wall = max(duration, max(r["end"] for r in ok) - t0)  # the arrival window at least: it was offered over it
    level |= {
        f"ttfa_p{q}_ms": 1000 * percentile(ttfa, q) for q in (50, 95, 99)
    } | {
        "ttfa_max_ms": 1000 * max(ttfa),
        "underrun_share": sum(u > 0 for u in und) / len(und),
        "continuity_ok_rate": sum(u < CONTINUITY_S for u in und) / len(und),
        "underrun_p99_ms": 1000 * percentile(und, 99),
        "audio_s_per_s": sum(r["audio_s"] for r in ok) / wall,
        "wall_s": wall,
        "xrt_per_stream_p50": percentile([r["xrt"] for r in ok], 50),
        "in_flight_mean": sum(r["end"] - r["start"] for r in ok) / wall,
        "exact_length_rate": sum(r["samples"] == r["frames"] * samples_per_frame for r in ok) / len(ok),
    }  # fmt: skip
    if all("setup_s" in r for r in ok):  # WebSocket: the session's connection and config before its clock
        arrival = [r["ttfa"] + r["setup_s"] for r in ok]
        level |= {f"ttfa_arrival_p{q}_ms": 1000 * percentile(arrival, q) for q in (50, 95, 99)}
    return level


def peak_batch(level: dict) -> float:
    """The largest mean batch of the level's sampling intervals."""
    return max((p["batch_mean"] for p in level["timeline"]), default=0.0)


def print_rate(tag: str, transport: str, lv: dict) -> None:
    if not lv["completed"]:
        what = f"all {lv['requests']} failed: {lv['errors']}" if lv["requests"] else "no arrival in the window"
        print(f"[{tag} {transport}] {lv['rate']:g}/s: {what}", flush=True)
        return
    arrival = f" (from arrival p95 {lv['ttfa_arrival_p95_ms']:.1f})" if "ttfa_arrival_p95_ms" in lv else ""
    print(
        f"[{tag} {transport}] {lv['rate']:5g}/s n={lv['requests']:4d} failed {lv['failed']}"
        f" | TTFA p50 {lv['ttfa_p50_ms']:7.1f} p95 {lv['ttfa_p95_ms']:7.1f} p99 {lv['ttfa_p99_ms']:7.1f} ms{arrival}"
        f" | underrun any {lv['underrun_share']:.2f} ok {lv['continuity_ok_rate']:.2f}"
        f" | audio {lv['audio_s_per_s']:6.1f} of {lv['offered_audio_s_per_s']:6.1f} s/s"
        f" | in flight {lv['in_flight_mean']:5.1f}, batch max {peak_batch(lv):5.1f}"
        f" | lag p99 {lv['send_lag_ms_p99']:.1f} ms",
        flush=True,
    )
    if "work" in lv:  # in process: where the device worker's time went while the rate ran
        work = lv["work"]
        parts = ", ".join(f"{k} {v:.2f} s ({work['counts'][k]})" for k, v in list(work["seconds"].items())[:5])
        print(f"    worker busy {100 * work['busy_fraction']:.0f}% of {work['span_s']:.1f} s: {parts}", flush=True)
    split = lv.get("first_audio_split", {})
    if split.get("requests"):  # in process: where a first audio's time went, p50 / p95 / slowest 5 % mean
        parts = ", ".join(f"{p} {split[p]['p50']:.1f}/{split[p]['p95']:.1f}/{split[p]['slowest_5pct_mean']:.1f}"
                          for p in FIRST_AUDIO_PARTS)  # fmt: skip
        print(f"    first audio, ms (p50/p95/slowest 5 % mean): {parts}", flush=True)


# --- one arm: a server (or an engine) with its environment, every mode, lengths, transport and rate ---


def tag_of(args: argparse.Namespace, mode: str, lengths: Lengths, arm: str) -> str:
    size = f"tiny-{args.size}" if args.tiny else args.size
    return (size + ("" if mode == "custom" else f"-{mode}") + f"_{lengths.tag}" + (f"_{arm}" if arm else "")
            + args.tag_suffix)  # fmt: skip


def result_path(tag: str, transport: str) -> Path:
    return out_dir() / f"tts_load_{tag}_{transport}.json"


async def drive(
    transport: Transport, args: argparse.Namespace, arm: str, env: dict[str, str], info: dict, new_client=None
) -> None:
    """Warm up, then every lengths spec at every rate (in process, each ``--retune`` arm in turn at each rate, on the
    same engine), then the ``--bursts`` levels; saves after each rate."""
    fields = transport.fields
    family = transport.engine.models.speech() if transport.engine is not None else None
    retunes = [(name, transport.engine.tuning.with_assignments(a, "--retune")) for name, a in args.retunes] if (
        family is not None and args.retunes) else [("", None)]  # fmt: skip
    for i in range(2):  # warm-up, not measured: a lone request and a small burst of this mode
        await asyncio.gather(*(transport.request(Spoken(k, TEXT, WARMUP_FRAMES)) for k in range(1 + 3 * i)))
    if transport.timer is not None:
        transport.timer.reset()
    for lengths in args.lengths:
        results = {}
        for name, tuning in retunes:
            tag = tag_of(args, fields.mode, lengths, "_".join(filter(None, (arm, name))))
            result = base_result(args, transport.name, fields) | info
            result |= {
                "size": tag, "benchmark": "open loop (Poisson arrivals)", "arm": arm or None, "arm_env": env,
                "retune": name or None, "tuning": tuning.describe() if tuning is not None else None,
                "lengths_s": [lengths.lo, lengths.hi], "seed": args.seed, "sample_ms": args.sample_ms,
            }  # fmt: skip
            result.pop("levels")
            result["rates"] = []
            results[name] = (tag, result)
        for rate in args.rates:
            for name, tuning in retunes:  # the arms take turns at each rate: drift over the run hits them alike
                if tuning is not None:
                    await retune(family, tuning)
                tag, result = results[name]
                level = await run_rate(transport, rate, args, lengths)
                result["rates"].append(level)
                print_rate(tag, transport.name, level)
                result_path(tag, transport.name).write_text(json.dumps(result, indent=2) + "\n")
    if args.bursts:
        await bursts(transport, args, arm, retunes, info, new_client)


async def retune(family, tuning) -> None:
    """Apply an arm's tuning once the talker is idle: a finished request's sequence is released by the worker's next
    round, just after its stream ends (a benchmark-side wait on the scheduler's counts, bounded)."""
    t0 = time.perf_counter()
    while family.runner.num_active or any(family.scheduler.live().values()):
        if time.perf_counter() - t0 > 30:
            raise RuntimeError(f"the talker is still busy 30 s after a level: {family.scheduler.live()}")
        await asyncio.sleep(0.01)
    family.retune(tuning)


async def bursts(transport: Transport, args: argparse.Namespace, arm: str, retunes, info: dict, new_client) -> None:
    """``--bursts`` levels of ``--burst-frames`` each, as ``tts_bench.py`` measures them, on this server or engine
    (``tts_bench_<tag>[_<transport>].json``)."""
    family = transport.engine.models.speech() if transport.engine is not None else None
    driver = Driver(transport.name, transport.fields, engine=transport.engine, url=transport.url,
                    client=transport.client, new_client=new_client)  # fmt: skip
    for name, tuning in retunes:
        if tuning is not None:
            await retune(family, tuning)
        bench_args = argparse.Namespace(**vars(args))
        bench_args.levels, bench_args.frames = args.bursts, args.burst_frames
        suffix = "_".join(filter(None, (arm, name)))
        result = base_result(args, transport.name, transport.fields) | info
        result["size"] = mode_tag(args, transport.fields.mode) + (f"_{suffix}" if suffix else "")
        result["samples_per_frame"] = transport.samples_per_frame
        result["retune"] = tuning.describe() if tuning is not None else None
        await drive_bursts(driver, result, bench_args, transport.timer)


async def run_inproc(ckpt: Path, args: argparse.Namespace, arm: str, env: dict[str, str]) -> None:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the family reads its switches when it loads
    try:
        # the worker's log: where its time went at each rate (the talker's steps, the codec's windows, idle)
        engine, info = await load_engine(ckpt, args, args.tag + (f" {arm}" if arm else ""), record=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    timer = StepTimer(engine.models.speech())
    async with engine:
        for mode in args.modes:
            fields = RequestFields(mode, args.ref_seconds, args.ref_pool, args.initial_frames)
            prompt_s = await fields.extract(engine)
            transport = Transport("inproc", fields, info["samples_per_frame"], engine=engine, timer=timer)
            await drive(transport, args, arm, env, info | {"voice_prompt_s": prompt_s})
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


async def run_server(ckpt: Path, args: argparse.Namespace, arm: str, env: dict[str, str], tmp: Path) -> None:
    import httpx

    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    served = [t for t in args.transports if t != "inproc"]
    with server_process(ckpt, args, port, tmp / f"voices{arm}", env) as proc:
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            ready_s = await wait_healthy(client, url, proc, args.server_timeout, served_name(port))
            print(f"[{args.tag}{' ' + arm if arm else ''}] server ready in {ready_s:.1f} s", flush=True)
            model = (await client.get(f"{url}/v1/models")).json()["data"][0]
            for mode in args.modes:
                fields = RequestFields(mode, args.ref_seconds, args.ref_pool, args.initial_frames)
                upload_s = await fields.upload(client, url)
                for name in served:
                    # One keep-alive pool for the whole transport's run: connections are reused as requests end.
                    async with httpx.AsyncClient(limits=limits, timeout=timeout) as pool:
                        spf = round(model["sample_rate"] * FRAME_S)
                        transport = Transport(name, fields, spf, url=url, client=pool)
                        info = {"server_ready_s": ready_s, "voice_upload_s": upload_s}
                        fresh = functools.partial(httpx.AsyncClient, limits=limits, timeout=timeout)
                        await drive(transport, args, arm, env, info, fresh)


async def run_all(args: argparse.Namespace) -> None:
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(args.size, args.kind, args.tiny, Path(tmp) / "ckpt", dtype)
        for arm, env in args.arms:
            if "inproc" in args.transports:
                await run_inproc(ckpt, args, arm, env)
            if any(t != "inproc" for t in args.transports):
                await run_server(ckpt, args, arm, env, Path(tmp))


# --- table and plot of saved results ---


def summarize(match: str = "", plot: str = "tts_load") -> int:
    """Print every ``tts_load_*.json`` under the output folder (whose name holds ``match``) as a Markdown table; plot
    them (``<plot>.png``)."""
    paths = sorted(p for p in out_dir().glob("tts_load_*.json") if match in p.stem)
    results = {p.stem.removeprefix("tts_load_"): json.loads(p.read_text()) for p in paths}
    if not results:
        print("no results")
        return 1
    print("| run | rate /s | requests | TTFA p50 ms | p95 ms | p99 ms | any underrun | continuity OK "
          "| audio s/s (offered) | in flight | batch max | engine step ms |")  # fmt: skip
    print("|---" * 12 + "|")
    for name, res in results.items():
        for lv in res["rates"]:
            if not lv["completed"]:
                what = "all failed" if lv["requests"] else "no arrival"
                print(f"| {name} | {lv['rate']:g} | {lv['requests']} | {what} | | | | | | | | |")
                continue
            batch = peak_batch(lv)
            step = lv.get("server_step_ms_mean", lv.get("step_wall_ms_p50"))
            print(
                f"| {name} | {lv['rate']:g} | {lv['requests']} | {lv['ttfa_p50_ms']:.1f} | {lv['ttfa_p95_ms']:.1f}"
                f" | {lv['ttfa_p99_ms']:.1f} | {lv['underrun_share']:.2f} | {lv['continuity_ok_rate']:.2f}"
                f" | {lv['audio_s_per_s']:.1f} ({lv['offered_audio_s_per_s']:.1f}) | {lv['in_flight_mean']:.1f}"
                f" | {batch:.1f} | {'-' if step is None else f'{step:.2f}'} |"
            )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return 0
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for name, res in results.items():
        rates = [lv for lv in res["rates"] if lv["completed"]]
        xs = [lv["rate"] for lv in rates]
        line = axes[0].plot(xs, [lv["ttfa_p95_ms"] for lv in rates], "o-", label=f"{name} p95")[0]
        axes[0].plot(xs, [lv["ttfa_p50_ms"] for lv in rates], ":", color=line.get_color())
        axes[1].plot(xs, [lv["audio_s_per_s"] for lv in rates], "o-", color=line.get_color(), label=name)
        axes[2].plot(xs, [lv["underrun_share"] for lv in rates], "o-", color=line.get_color(), label=name)
    titles = (
        "time to first audio, p95 (p50 dotted), ms",
        "audio seconds delivered per second",
        "share with any underrun",
    )
    rates = sorted({lv["rate"] for res in results.values() for lv in res["rates"]})
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
        ax.minorticks_off()
        ax.set_xlabel("arrivals per second (Poisson)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=6, loc="upper left")
    first = next(iter(results.values()))
    fig.suptitle(f"Qwen3-TTS under open-loop load, random weights, {first['gpu']}, commit {first['git_commit'][:12]}")
    fig.tight_layout()
    fig.savefig(out_dir() / f"{plot}.png", dpi=110)
    print(f"wrote {out_dir() / f'{plot}.png'}")
    return 0


def parse_arm(spec: str) -> tuple[str, dict[str, str]]:
    """``NAME:ASSIGN,...``: each ASSIGN a variable of the arm's engine (``OMNI_STREAM_VAR=VALUE``) or a flag of its
    server (``--flag=VALUE``, e.g. ``--http=h11``)."""
    name, _, assigns = spec.partition(":")
    env = {}
    for item in filter(None, (a.strip() for a in assigns.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.startswith(("OMNI_STREAM_", "--")):
            raise ValueError(f"--arm {spec!r}: give NAME:OMNI_STREAM_VAR=VALUE or NAME:--serve-flag=VALUE[,...]")
        env[key] = value
    if not name.isidentifier():
        raise ValueError(f"--arm {spec!r}: NAME must be a word (letters, digits, _)")
    return name, env


def parse_retune(spec: str) -> tuple[str, list[str]]:
    """``NAME:field=value,...``: a name and tuning assignments (checked now: a field and value ``--tune`` takes)."""
    from omni_stream.errors import ConfigError
    from omni_stream.runtime.settings import Tuning

    name, _, assigns = spec.partition(":")
    if not name.isidentifier():
        raise ValueError(f"{spec!r}: give NAME:field=value[,...] with NAME a word")
    assignments = [a.strip() for a in assigns.split(",") if a.strip()]
    try:
        Tuning().with_assignments(assignments, "--retune")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return name, assignments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("0.6b", "1.7b"), default="1.7b")
    ap.add_argument("--tiny", action="store_true", help="the tiny test checkpoint of --size's shape (CPU smoke runs)")
    ap.add_argument("--rates", default="5,10,20,40,80", help="arrivals per second, comma-separated")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals per rate (then it drains)")
    ap.add_argument("--lengths", default="2-20", help="comma-separated: LO-HI seconds (uniform) or S (fixed)")
    ap.add_argument("--seed", type=int, default=0, help="arrivals and lengths (per rate)")
    ap.add_argument("--transport", default="http,ws", help="comma-separated: inproc, http, ws")
    ap.add_argument("--voice-mode", default="custom", help=f"comma-separated, one kind: {', '.join(VOICE_MODES)}")
    ap.add_argument("--ref-seconds", type=float, default=6.0, help="reference audio per clip (clone and voice modes)")
    ap.add_argument("--ref-pool", type=int, default=0, help="reference clips in turn (0: every request its own)")
    ap.add_argument("--initial-frames", type=int, default=None, help="initial_codec_chunk_frames of every request")
    ap.add_argument("--arm", action="append", default=[], help="NAME:OMNI_STREAM_VAR=VALUE[,...] (repeatable)")
    ap.add_argument(
        "--retune",
        action="append",
        default=[],
        help="in process: NAME:field=value[,...] (tuning fields, as serve --tune), arms on one engine (repeatable)",
    )
    ap.add_argument("--bursts", default="", help="burst levels (tts_bench.py) after the open loop, e.g. 1,32,128")
    ap.add_argument("--burst-frames", type=int, default=150, help="frames per burst request (150 = 12 s)")
    ap.add_argument("--levels", default="", help=argparse.SUPPRESS)  # tts_bench's, unused here
    ap.add_argument("--sample-ms", type=float, default=250.0, help="the engine's live batch, sampled this often")
    ap.add_argument("--max-batch", type=int, default=128, help="engine batch size (the server's --max-concurrency)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    ap.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for the server to load")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds a read may wait on a stream")
    ap.add_argument("--tag-suffix", default="", help="appended to every result's tag")
    ap.add_argument("--summarize", action="store_true", help="print the table of saved results and plot them")
    ap.add_argument("--match", default="", help="--summarize: only the results whose name holds this")
    ap.add_argument("--plot", default="tts_load", help="--summarize: the plot's name (<plot>.png)")
    args = ap.parse_args(argv)
    checks = {
        "--rates": lambda: [float(x) for x in args.rates.split(",")],
        "--lengths": lambda: [Lengths.parse(x.strip()) for x in args.lengths.split(",") if x.strip()],
        "--voice-mode": lambda: [m.strip() for m in args.voice_mode.split(",") if m.strip()],
        "--arm": lambda: [parse_arm(a) for a in args.arm] or [("", {})],
        "--retune": lambda: [parse_retune(a) for a in args.retune],
        "--bursts": lambda: [int(c) for c in args.bursts.split(",") if c.strip()],
    }
    parsed = {}
    for option, check in checks.items():
        try:
            parsed[option] = check()
            if option == "--voice-mode":
                args.kind = mode_kind(parsed[option])
        except ValueError as exc:
            ap.error(f"{option}: {exc}")
    args.rates, args.lengths, args.modes, args.arms, args.retunes, args.bursts = (parsed[k] for k in checks)
    if any(r <= 0 for r in args.rates):
        ap.error(f"--rates: arrivals per second must be positive, got {args.rates}")
    args.transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    if not args.transports or set(args.transports) - set(TRANSPORTS):
        ap.error(f"--transport: choose from {', '.join(TRANSPORTS)}")
    if "inproc" in args.transports and any(k.startswith("--") for _, env in args.arms for k in env):
        ap.error("--arm: server flags (--flag=VALUE) need a server transport, not inproc")
    if args.retunes and set(args.transports) != {"inproc"}:
        ap.error("--retune: arms on one engine are in process only (--transport inproc); --arm starts servers")
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    args.tag = f"tiny-{args.size}" if args.tiny else args.size
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        return summarize(args.match, args.plot)
    asyncio.run(run_all(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
