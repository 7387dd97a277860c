"""FrameSession: a stream of frames prefilled into a held cache as they arrive, so a question about them costs
the question's tokens, not the frames'.

``async with family.frame_session(max_frames=8) as session``: each ``await session.add_frame(rgb)`` prepares the
frame on the loop's preparation threads, then on the device worker encodes it and prefills its tokens after the
session's rows (past ``max_frames`` the oldest frames leave; :mod:`.runner`). A question is an ordinary chat
request whose user turn shows the session's frames: ``engine.chat(TextRequest(messages=session.messages(text)))``
(or any request whose images are the session's frames, or its first ones, in order, after the same system turn: a
question written before later frames arrived still matches): its prompt continues the session's rows, and its
tokens are those of the whole prompt prefilled at once. Closing the session frees its
rows; a question still in flight then prefills its whole prompt from the frames' stored features.

The session keeps a read-only copy of each frame (:func:`~.frames.frozen`): the caller may reuse its array.
Its rows and slot are released however its owner ends, a plain ``task.cancel()`` included (which an anyio shield
does not stop): the close job is shielded from the awaiting task's cancellation, and a session whose opener was
cancelled while it opened is closed as soon as it opens.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import numpy as np

from omni_stream.errors import EngineClosed, InvalidRequestError
from omni_stream.models.qwen_vl.frames import SessionView, frozen, image_key
from omni_stream.models.qwen_vl.runner import FrameIn
from omni_stream.models.qwen_vl.vision import PreparedImage, prepare_image
from omni_stream.requests import ChatMessage, Role
from omni_stream.runtime.offload import run_prepare

if TYPE_CHECKING:
    from omni_stream.models.qwen_vl.family import QwenVLFamily


class FrameSession:
    """One session's frames in a held cache (see the module docstring); ``max_frames``: the window, oldest out;
    ``system``: the system turn of its questions (None: none). Entered once."""

    def __init__(self, family: QwenVLFamily, *, max_frames: int, system: str | None) -> None:
        self._family = family
        self._runner = family.runner
        self.max_frames = max_frames
        self.system = system
        self._sid: int | None = None
        self._entered = False

    async def __aenter__(self) -> FrameSession:
        if self._entered:
            raise RuntimeError("a frame session is entered once")
        self._entered = True
        prefix = await run_prepare(self._family.session_prefix, self.system)
        opened = self._family.worker.submit(self._runner.session_open, prefix, self.max_frames)
        try:
            with anyio.CancelScope(shield=True):  # an open session is closed by its owner: it must learn its id
                view = await asyncio.shield(opened)  # a task.cancel() passes the anyio shield, not this one
        except BaseException:
            opened.add_done_callback(self._close_orphan)  # cancelled: nobody else will close what opens
            raise
        self._sid = view.sid
        return self

    def _close_orphan(self, opened: asyncio.Future[SessionView]) -> None:
        """Close a session that opened after its opener was cancelled (a done callback, on the loop)."""
        if opened.cancelled() or opened.exception() is not None:
            return
        try:
            self._family.worker.submit(self._runner.session_close, opened.result().sid)
        except EngineClosed:
            pass  # the worker is gone and its cache with it

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _prepare(self, image: np.ndarray) -> tuple[np.ndarray, PreparedImage, bytes]:
        if not isinstance(image, np.ndarray):
            raise InvalidRequestError(f"a frame must be a uint8 RGB array, got {type(image).__name__}", "image")
        kept = frozen(image)  # copied first: patches and key are of the pixels kept
        try:
            return kept, prepare_image(kept, self._family.image_spec), image_key(kept)
        except InvalidRequestError as exc:  # a frame is its own field, not a message's
            raise InvalidRequestError(exc.message, "image") from exc

    async def add_frame(self, image: np.ndarray) -> None:
        """Prefill one uint8 RGB ``(h, w, 3)`` frame after the others (InvalidRequestError naming ``image`` for
        one that is not an image or does not fit the session's rows)."""
        if self._sid is None:
            raise RuntimeError("the frame session is not open")
        kept, prepared, key = await run_prepare(self._prepare, image)
        # Frames of every session pending when the worker picks them up go through the vision tower together.
        frame = FrameIn(self._sid, kept, key, prepared)
        out = await self._family.worker.submit_batched(self._runner, frame, self._runner.session_append_many)
        if isinstance(out, Exception):
            raise out

    @property
    def frames(self) -> tuple[np.ndarray, ...]:
        """The frames in the window now, oldest first."""
        view = self._runner.views.get(self._sid) if self._sid is not None else None
        return tuple(f.image for f in view.frames) if view is not None else ()

    def messages(self, text: str) -> tuple[ChatMessage, ...]:
        """A question about the frames: the system turn, then a user turn showing the frames before ``text``."""
        turns = (ChatMessage(Role.SYSTEM, self.system),) if self.system is not None else ()
        return (*turns, ChatMessage(Role.USER, text, images=self.frames))

    async def aclose(self) -> None:
        """Free the session's rows (idempotent). The close runs on the device worker even when the caller is
        cancelled meanwhile, by an anyio scope or a plain ``task.cancel()``."""
        sid, self._sid = self._sid, None
        if sid is not None:
            closed = self._family.worker.submit(self._runner.session_close, sid)
            with anyio.CancelScope(shield=True):
                await asyncio.shield(closed)  # the worker skips a job whose future was cancelled
