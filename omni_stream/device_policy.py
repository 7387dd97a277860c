"""What runs next on a shared device: work classes, deadlines and the fairness bound, as pure functions.

Several models share one device worker (:mod:`omni_stream.worker`), so the worker chooses what runs next. Every
step source has a :class:`WorkClass`:

- ``REALTIME``: work a listener waits for (speech frames, an agent's turn, LM tokens feeding TTS, transcription).
  Its *deadline* is when its most urgent stream runs dry: for a stream already playing, the end of the audio its
  listener holds (``first_chunk + audio_seconds`` on the playback clock, the underrun metric's model); for a request
  that has not produced its first audio yet, or produces no audio (text), now.
- ``THROUGHPUT``: work measured in items per second (denoising steps of images, video chunks). No listener waits
  on one step of it, so it runs when the realtime streams can spare the time: when every live realtime stream keeps
  more slack than the step holds the device (``margin`` on top: the longest stretch of it between two yield points,
  where realtime work that falls due runs, see :meth:`~omni_stream.worker.DeviceWorker.yield_point`; its whole
  step where it has none), or when it has waited ``max_wait`` (the fairness bound: it is never starved, even under
  a full realtime load).

A realtime source whose streams all hold ``yield_slack`` seconds or more yields to a throughput step (a stream
with seconds buffered waits for one that is about to underrun, and for throughput work); among realtime sources
the earliest deadline runs first. Jobs (one-off and batched; the codec's windows, prompt preparation) are realtime.

Realtime requests that no listener plays yet (a transcript, an answer's text, speech before its first audio) are
all due now, so by deadline alone every such model would step once a round, and a model serving two requests would
slow one serving thirty as much as the reverse: with 32 voice sessions ending their turns together, the transcripts
of 30 took 248 ms of 3 ms decode steps because each waited for the answer-text and speech steps of the 2 sessions
whose transcripts had finished first (``voice_bench`` run 59). So such a request also has a *virtual time*:
``created + steps * quantum``, the quantum its model's own step time (an average of its steps without newcomers;
``quantum`` until one is measured), and a source's is its most-behind request's. A model stepped every round keeps
its requests at or behind the clock; one that got more of the device than the others drifts ahead of them.
A source whose virtual time is more than ``lead`` ahead of the most-behind runnable source's sits the round out,
unless one of its streams plays with less than ``margin`` of audio left, or it has sat out ``max_skip`` already (so
nothing waits longer than that for a step). The requests furthest behind catch up first, across models. Off by
default (``lead`` 0, ``Tuning.realtime_lead_ms``). Measured with a fixed 10 ms quantum (``0c17bc3``), at 50 ms it
shortened the voice agent's turns at 16 and 32 sessions by ~50 ms on average (``voice_bench`` run 61) but delayed
chat's first audio at c=16 by 41 ms (``chat_bench`` run 62): the quantum was longer than the LM's real steps, so its
virtual time ran ahead of the clock and it sat out while some of its rows still owed the talker their first clause.
The model's own step time as the quantum is what followed; it is not measured yet.

A model's requests can also wait on a model downstream of them: an answer's text once its first spoken unit went to
the speech model (``Timings.handed_off``) is needed again only when that unit's audio plays out, while the speech
model's newcomers are due now. With ``handoff_yield`` (``Tuning.realtime_handoff_yield``), a source none of whose
requests is due and one of which waits so sits the round out while another runnable realtime source has work due
now (a newcomer, a first chunk, a transcript), for at most ``max_skip``, unless one of its streams plays with less
than ``margin`` left. A source with a request still owing its first unit is due, so it never sits out on this rule
(unlike the virtual-time rule's fixed quantum in ``chat_bench`` run 62). Where it pays: a voice turn's answer
(``voice_bench`` at 16 sessions, the text model's decode steps of 7-17 ms between the talker's prefill and its
first window, each waiting on the talker's kernels). Off by default: measured there (``voice_bench`` run 63, one
H200, against off in the same call) it was no better at 16 sessions and 87 ms worse at 32 (v2v p95, three rounds).

A step is the unit: no job holds the device longer than one step of its model (one decode step, one denoising
step, one VAE decode), so a realtime step waits at most one throughput step, and where the model has yield points
only until the next one.

Its switches are fields of the tuning object (:class:`~omni_stream.runtime.settings.Tuning`: ``device_policy``,
``throughput_wait_ms``, ``throughput_stream``, ``realtime_priority``, ``throughput_fence``, ``realtime_streams``);
:meth:`DevicePolicy.from_tuning` reads them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_stream.runtime.settings import Tuning

DEFAULT_MAX_WAIT_S = 0.5
DEFAULT_MARGIN_S = 0.05
DEFAULT_YIELD_SLACK_S = 1.0
DEFAULT_STEP_COST_S = 0.05  # a throughput source's step cost before one was measured
DEFAULT_MIN_PROGRESS_S = 0.1  # after realtime work held a step max_wait at a yield point, it runs this long first
DEFAULT_QUANTUM_S = 0.01  # a model's step in virtual time until its own step time is measured
DEFAULT_LEAD_S = 0.0  # a realtime source this far ahead in virtual time sits a round out (0: never; measured at 0.05)
DEFAULT_MAX_SKIP_S = 0.05  # ... for at most this long


class WorkClass(StrEnum):
    REALTIME = "realtime"
    THROUGHPUT = "throughput"


@dataclass(slots=True, frozen=True)
class DevicePolicy:
    """How the worker orders work across models. Seconds throughout.

    ``deadlines``: False restores plain rounds (every runnable job and every runnable source once per round, in
    attach order, whatever its class): the comparison point of ``benchmarks/colocation_bench.py``.
    ``max_wait``: the fairness bound, the longest a runnable throughput source waits for a step (default 0.5).
    ``margin``: slack a realtime stream keeps beyond a throughput step's expected cost (default 0.05).
    ``yield_slack``: a realtime source whose streams all hold this much slack yields to throughput (default 1.0).
    ``min_progress``: once realtime work has held a throughput step ``max_wait`` at one of its yield points, the
    step runs at least this long before its next one (default 0.1).
    ``throughput_stream``: on CUDA, throughput steps launch on a side stream of their own so their kernels overlap
    the realtime models' (default True; no effect on CPU). Its priority is the lowest, which is also the default
    stream's: the realtime models' kernels go first on the device only with ``realtime_priority``.
    ``realtime_priority``: on CUDA, the worker's realtime work launches on a stream of higher priority than the
    throughput steps' (:mod:`omni_stream.runtime.worker_streams`; default False: beside image and video work a
    speech burst got its first audio later with it, GPU colocation runs 50 and 52; no effect on CPU).
    ``throughput_fence``: on CUDA, a throughput step starts only once the last one's device work is done, so the
    host never queues more than one step on the side stream (default False: later first audio with it, run 55; no
    effect on CPU).
    ``realtime_streams``: on CUDA, each realtime source's steps launch on a stream of its own, so one model's step
    (its kernels, and the copy that ends it) does not queue behind another's (default False; no effect on CPU).
    ``quantum``, ``lead``, ``max_skip``: a step in virtual time before a model's own step time is measured, and how
    far ahead of the most-behind source a realtime source may be before it sits a round out, for at most how long
    (the module docstring; ``lead`` 0: every runnable realtime source steps every round).
    ``handoff_yield``: a source whose requests wait on a downstream model's first audio sits out while another has
    work due now, for at most ``max_skip`` (the module docstring; default False).
    """

    deadlines: bool = True
    max_wait: float = DEFAULT_MAX_WAIT_S
    margin: float = DEFAULT_MARGIN_S
    yield_slack: float = DEFAULT_YIELD_SLACK_S
    default_cost: float = DEFAULT_STEP_COST_S
    min_progress: float = DEFAULT_MIN_PROGRESS_S
    throughput_stream: bool = True
    realtime_priority: bool = False
    throughput_fence: bool = False
    realtime_streams: bool = False
    quantum: float = DEFAULT_QUANTUM_S
    lead: float = DEFAULT_LEAD_S
    max_skip: float = DEFAULT_MAX_SKIP_S
    handoff_yield: bool = False

    @property
    def reads_standing(self) -> bool:
        """Whether a round needs each realtime source's :class:`Standing` (it reads every sequence: only for a rule
        that is on)."""
        return self.lead > 0 or self.handoff_yield

    def __post_init__(self) -> None:
        for name in ("max_wait", "margin", "yield_slack", "default_cost", "min_progress", "quantum", "lead",
                     "max_skip"):  # fmt: skip
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 s, got {getattr(self, name)}")

    @classmethod
    def from_tuning(cls, tuning: Tuning) -> DevicePolicy:
        """The policy the tuning object's switches ask for (``device_policy``, ``throughput_wait_ms``,
        ``throughput_stream``, ``realtime_priority``, ``throughput_fence``, ``realtime_streams``,
        ``realtime_lead_ms``, ``realtime_handoff_yield``); the rest at their defaults."""
        return cls(
            deadlines=tuning.device_policy == "deadlines",
            max_wait=tuning.throughput_wait_ms / 1000,
            throughput_stream=tuning.throughput_stream,
            realtime_priority=tuning.realtime_priority,
            throughput_fence=tuning.throughput_fence,
            realtime_streams=tuning.realtime_streams,
            lead=tuning.realtime_lead_ms / 1000,
            handoff_yield=tuning.realtime_handoff_yield,
        )


@dataclass(slots=True, frozen=True)
class Ready:
    """A runnable step source as the policy sees it. ``deadline``: realtime, when its most urgent stream runs dry
    (``perf_counter`` s; None: as soon as possible). ``since``: when it last ran or became runnable. ``cost``:
    throughput, the seconds one step is expected to hold the device without a yield point. Realtime, where the
    source tells them (else None): ``virtual``, the virtual time of its most-behind request that no listener plays
    yet; ``playback``, when its most urgent playing stream runs dry; ``handed``, none of its requests is due and one
    waits on a downstream model's first audio (:class:`Standing`)."""

    key: Hashable
    deadline: float | None = None
    since: float = 0.0
    cost: float = DEFAULT_STEP_COST_S
    virtual: float | None = None
    playback: float | None = None
    handed: bool = False


@dataclass(slots=True, frozen=True)
class Standing:
    """Where a realtime source's live streams stand (``perf_counter`` s). ``playback``: when its most urgent playing
    stream runs dry (None: none plays); ``virtual``: the virtual time of its most-behind request that no listener
    plays yet (None: none); ``due``: a request is due now (one no listener plays yet, or a newcomer); ``handed``:
    nothing is due and a request waits on the first audio of what it handed a downstream model (read only with
    ``handoff_yield``)."""

    playback: float | None
    virtual: float | None
    due: bool
    handed: bool = False


JOBS = "jobs"
"""The plan's token for the pending one-off and batched jobs (realtime, run in arrival order)."""


@dataclass(slots=True, frozen=True)
class Plan:
    """One round: ``order`` (source keys and :data:`JOBS`, in the order they run), or nothing to run now and the
    seconds after which to look again (``wait``; None: until notified)."""

    order: tuple[Hashable, ...]
    wait: float | None = None


def _slack(deadline: float | None, now: float) -> float:
    return -math.inf if deadline is None else deadline - now


def _later(virtual: float | None) -> float:
    return math.inf if virtual is None else virtual


def sits_out(
    ready: Ready, behind: float | None, now: float, policy: DevicePolicy, *, due_elsewhere: bool = False
) -> bool:
    """Whether runnable realtime source ``ready`` sits this round out (pure): its virtual time is more than
    ``lead`` ahead of ``behind`` (the most-behind runnable source's), or (``handoff_yield``) it waits on a
    downstream model while another runnable realtime source has work due now (``due_elsewhere``); and none of its
    streams plays with less than ``margin`` left, and it last ran (or became runnable) under ``max_skip`` ago."""
    ahead = (
        policy.lead > 0 and ready.virtual is not None and behind is not None and ready.virtual - behind > policy.lead
    )
    handed = policy.handoff_yield and ready.handed and due_elsewhere
    if not (ahead or handed):
        return False
    if ready.playback is not None and ready.playback - now < policy.margin:
        return False
    return now - ready.since < policy.max_skip


def plan_round(
    now: float,
    *,
    jobs: bool,
    realtime: Sequence[Ready],
    throughput: Sequence[Ready],
    demand: float | None,
    policy: DevicePolicy,
) -> Plan:
    """Order one round of the worker (pure).

    ``jobs``: one-off or batched jobs are pending. ``realtime`` / ``throughput``: the runnable sources.
    ``demand``: the earliest deadline of every live realtime stream, runnable or not (a request being prepared,
    a stream whose next window is on its way), None when no realtime stream is live.

    A throughput source that has waited ``max_wait`` runs first (one per round). Then the jobs, then the realtime
    sources under ``yield_slack``, earliest deadline first (at equal deadlines, the most behind in virtual time
    first), less those far ahead in virtual time or waiting on a downstream model (:func:`sits_out`). Then one
    throughput step if every live realtime stream can spare its cost plus ``margin``; the realtime sources with
    ``yield_slack`` or more run only in a round without such a step. With nothing runnable now, ``wait`` says when
    a blocked throughput source falls due.
    """
    if not policy.deadlines:
        return Plan(((JOBS,) if jobs else ()) + tuple(r.key for r in (*realtime, *throughput)))
    order: list[Hashable] = []
    oldest = sorted(throughput, key=lambda r: r.since)
    picked = next((r for r in oldest if now - r.since >= policy.max_wait), None)
    if picked is not None:
        order.append(picked.key)
    if jobs:
        order.append(JOBS)
    virtuals = [r.virtual for r in realtime if r.virtual is not None]
    behind = min(virtuals) if virtuals else None
    due = [r.key for r in realtime if not r.handed and _slack(r.deadline, now) <= 0]
    stepping = [r for r in realtime if not sits_out(r, behind, now, policy, due_elsewhere=any(k != r.key for k in due))]
    by_deadline = sorted(stepping, key=lambda r: (_slack(r.deadline, now), _later(r.virtual)))
    urgent = [r for r in by_deadline if _slack(r.deadline, now) < policy.yield_slack]
    relaxed = [r for r in by_deadline if _slack(r.deadline, now) >= policy.yield_slack]
    order += [r.key for r in urgent]
    spare = math.inf if demand is None else demand - now
    stepped = False
    if picked is None and oldest and spare >= oldest[0].cost + policy.margin:
        order.append(oldest[0].key)
        stepped = True
    if not stepped:
        order += [r.key for r in relaxed]
    if order:
        return Plan(tuple(order))
    wait = None if not oldest else max(0.0, oldest[0].since + policy.max_wait - now)
    return Plan((), wait)


def capacity_budget(
    now: float,
    *,
    free: int,
    waiting: Sequence[tuple[float, bool]],
    running: int,
    cost_per_request: float,
    demand: float | None,
    policy: DevicePolicy,
    max_defer: float,
) -> int:
    """How many waiting throughput requests (oldest first) a scheduler admits now (pure).

    ``waiting``: ``(created, continuing)`` per waiting request, oldest first; a continuing one (a video session's
    next chunk) already holds its share of the device and is always admitted. A new one is admitted while one
    step of the batch with it still fits in the live realtime streams' slack (``demand - now``, less ``margin``),
    where a step costs ``cost_per_request`` per request; when nothing of this model runs (so throughput always
    progresses); or once it has waited ``max_defer`` seconds (never starved). At most ``free`` are admitted.
    """
    spare = math.inf if demand is None else demand - now - policy.margin
    admitted = 0
    rows = running
    for created, continuing in waiting:
        if admitted >= free:
            break
        fits = (rows + 1) * cost_per_request <= spare
        if not (continuing or fits or rows == 0 or now - created >= max_defer):
            break  # oldest first: a newer request never jumps a held one
        admitted += 1
        rows += 1
    return admitted
