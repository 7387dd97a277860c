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
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

import anyio
import numpy as np

from omni_stream.errors import InvalidRequestError
from omni_stream.models.qwen_vl.frames import image_key
from omni_stream.models.qwen_vl.runner import FrameIn
from omni_stream.models.qwen_vl.vision import PreparedImage, prepare_image
from omni_stream.requests import ChatMessage, Role
from omni_stream.runtime.offload import run_prepare

if TYPE_CHECKING:
    from omni_stream.models.qwen_vl.family import QwenVLFamily


class FrameSession:
    """One session's frames in a held cache (see the module docstring); ``max_frames``: the window, oldest out;
    ``system``: the system turn of its questions (None: none)."""

    def __init__(self, family: QwenVLFamily, *, max_frames: int, system: str | None) -> None:
        self._family = family
        self._runner = family.runner
        self.max_frames = max_frames
        self.system = system
        self._sid: int | None = None

    async def __aenter__(self) -> FrameSession:
        prefix = await run_prepare(self._family.session_prefix, self.system)
        with anyio.CancelScope(shield=True):  # an open session is closed by its owner: it must learn its id
            view = await self._family.worker.submit(self._runner.session_open, prefix, self.max_frames)
        self._sid = view.sid
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _prepare(self, image: np.ndarray) -> tuple[PreparedImage, bytes]:
        if not isinstance(image, np.ndarray):
            raise InvalidRequestError(f"a frame must be a uint8 RGB array, got {type(image).__name__}", "image")
        try:
            return prepare_image(image, self._family.image_spec), image_key(image)
        except InvalidRequestError as exc:  # a frame is its own field, not a message's
            raise InvalidRequestError(exc.message, "image") from exc

    async def add_frame(self, image: np.ndarray) -> None:
        """Prefill one uint8 RGB ``(h, w, 3)`` frame after the others (InvalidRequestError naming ``image`` for
        one that is not an image or does not fit the session's rows)."""
        if self._sid is None:
            raise RuntimeError("the frame session is not open")
        prepared, key = await run_prepare(self._prepare, image)
        # Frames of every session pending when the worker picks them up go through the vision tower together.
        frame = FrameIn(self._sid, image, key, prepared)
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
        """Free the session's rows (idempotent; runs to the end even when the caller is cancelled)."""
        sid, self._sid = self._sid, None
        if sid is not None:
            with anyio.CancelScope(shield=True):
                await self._family.worker.submit(self._runner.session_close, sid)
