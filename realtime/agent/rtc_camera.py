"""The voice agent that sees, over WebRTC: a camera track in beside the microphone, the agent's speech out.

Needs the ``[webrtc]`` extra (fastrtc). :class:`SeeingAgentHandler` is the voice agent of
:mod:`~omni_stream.realtime.agent.rtc_handler` (same session, turn detection, barge-in and data-channel logs) with
fastrtc's video half added; the camera stream under ``/rtc/camera`` (:mod:`~omni_stream.realtime.agent.rtc`) runs
it with ``modality="audio-video"``.

Frames in. fastrtc hands each decoded camera frame to :meth:`SeeingAgentHandler.video_receive` as bgr24 pixels. The
frame policy of :mod:`omni_stream.vision.frames` admits them, cheapest check first: the rate cap of
``Settings.frame_limits`` without its burst (at most ``max_fps`` frames a second, 8 by default; a camera sends 30,
the others are skipped at no cost: a camera is sampled, not refused), then, in a worker thread, BGR to RGB, the
pixel cap and the resolution cap (``max_side``), then the near-duplicate filter (vLLM-Omni's default 0.95: a still
scene is kept once). The window keeps one frame, the latest: memory stays one picture per connection however long
the call.

When the session sees it. The latest frame is shown when the user's turn starts (the session's ``speech_started``),
as a user ``conversation.item.create`` holding one ``input_image`` part (JPEG, encoded in a worker thread), so the
realtime session's own item and picture limits, truncation and refusals apply. The turn's start and not its pause:
the response, the preemptive one the session may start at the pause included, is built from the conversation as
it stands then, and the picture must be in it; at the start the item lands before the user's spoken item (which is
committed at the pause), so the model reads "the user showed this, then said that". A frame that has not changed
since the last one shown (no newer frame admitted) is not shown again. A turn shows at most one picture: when it
started with nothing new to show (the camera's first frame still on its way, or a still scene), the first new frame
kept before its pause is shown when it comes; one that changes after that is shown at the next turn. (A frame that
comes within the moment between the session's pause and the handler hearing of it lands after the spoken item: the
next turn's responses see it.)

A text model that does not see: frames are not admitted or shown; the data channel says ``camera_ignored`` once
(when the first frame comes) and the voice agent works as on the audio-only stream.

Video out: fastrtc's send-receive video track must be fed, and a None from ``video_emit`` would end it. It carries
the frames admitted (after the resolution cap), a self-view at the admitted rate; it waits while none is new.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from dataclasses import replace

import numpy as np
from fastrtc import AsyncAudioVideoStreamHandler
from fastrtc.utils import create_message

from omni_stream.engine import AsyncEngine
from omni_stream.family import ModelKind
from omni_stream.realtime.agent.events import ItemCreate, NewItem, NewPart, PartType
from omni_stream.realtime.agent.rtc_handler import VoiceAgentHandler
from omni_stream.realtime.agent.session import RealtimeSession
from omni_stream.realtime.state import ServerState
from omni_stream.vision.frames import Frame, FrameRateError, FrameWindow, frame_from_pixels

FRAME_FILTER = 0.95  # the near-duplicate filter's similarity threshold (vLLM-Omni's default)
JPEG_QUALITY = 90  # the picture shown to the session


def sees(engine: AsyncEngine | None) -> bool:
    """Whether the loaded text model takes images (False before the engine is loaded)."""
    if engine is None:
        return False
    models = engine.models
    return ModelKind.TEXT in models and models.text().info.sees_images


def jpeg_base64(pixels: np.ndarray) -> str:
    """A frame's RGB pixels as base64 JPEG (CPU work: call it off the event loop)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=JPEG_QUALITY)
    return base64.b64encode(buf.getvalue()).decode()


class SeeingAgentHandler(VoiceAgentHandler, AsyncAudioVideoStreamHandler):
    """One WebRTC peer's voice-agent session with a camera (see the module docstring)."""

    def __init__(self, state: ServerState) -> None:
        super().__init__(state)
        limits = replace(state.settings.frame_limits, burst=1)  # a camera is sampled at max_fps, never in bursts
        self.window = FrameWindow(limits, max_frames=1, threshold=FRAME_FILTER)
        self.shown: Frame | None = None  # the last frame shown to the session
        self.pictures_shown = 0
        self._view: np.ndarray | None = None  # the self-view's next frame (bgr24)
        self._view_ready = asyncio.Event()
        self._ignored = False  # camera_ignored was said
        self._turn_open = False  # between the session's speech_started and speech_stopped
        self._turn_shown = False  # a picture was shown in this turn
        self._showing = asyncio.Lock()  # turn starts and frames kept mid-turn show one picture at a time

    def copy(self) -> SeeingAgentHandler:
        return SeeingAgentHandler(self.state)

    async def video_receive(self, frame: np.ndarray) -> None:
        session = self.session
        if session is not None and not session.protocol.caps.sees:
            if not self._ignored:
                self._ignored = True
                await self.send_message(create_message("log", "camera_ignored"))
            return
        try:
            self.window.check_rate(time.monotonic(), "video")
        except FrameRateError:
            return  # sampled out
        rgb = frame[..., ::-1]  # fastrtc gives bgr24
        admitted = await asyncio.to_thread(frame_from_pixels, rgb, self.window.limits, "video")
        if self.window.offer(admitted):
            self._view = np.ascontiguousarray(admitted.pixels[..., ::-1])
            self._view_ready.set()
            if session is not None and self._turn_open and not self._turn_shown:
                await self._show(session)  # the turn began before there was anything new to show

    async def video_emit(self) -> np.ndarray:
        await self._view_ready.wait()
        self._view_ready.clear()
        assert self._view is not None
        return self._view

    async def turn_started(self, session: RealtimeSession) -> None:
        self._turn_open, self._turn_shown = True, False
        await self._show(session)

    def turn_ended(self) -> None:
        self._turn_open = False

    async def _show(self, session: RealtimeSession) -> None:
        """Show the session the latest frame kept, unless it was shown already."""
        async with self._showing:
            frames = self.window.frames
            if not session.protocol.caps.sees or not frames or frames[-1] is self.shown:
                return
            latest = self.shown = frames[-1]
            self._turn_shown = True
            image = await asyncio.to_thread(jpeg_base64, latest.pixels)
            item = NewItem("user", (NewPart(PartType.INPUT_IMAGE, image=image),))
            await session.client_event(ItemCreate(None, item))  # its refusal, if any, comes as an error event
            self.pictures_shown += 1
