"""WebRTC routes under ``/rtc``: a fastrtc ``Stream`` whose handler is the voice agent (``[webrtc]`` extra).

``POST /rtc/webrtc/offer`` (SDP offer/answer and trickle ICE, fastrtc's body ``{sdp, type, webrtc_id}``; an offer
that cannot start the agent is refused first, :mod:`~omni_stream.realtime.agent.rtc_offer`) and
``WS /rtc/websocket/offer`` (fastrtc's WebSocket audio transport: ``start``, ``media``, ``stop``). Mounted on
plain Starlette routes, so fastrtc's FastAPI app and Gradio UI are never started. No STUN/TURN server unless
``Settings.rtc_ice_servers`` names some (aiortc would otherwise fall back to a public STUN server); at most
``Settings.rtc_concurrency_limit`` connections, past which fastrtc answers ``{"status": "failed", "meta":
{"error": "concurrency_limit_reached"}}``.
``GET /rtc/config`` tells pages whether WebRTC is available and which ICE servers to use; without fastrtc it is
the only ``/rtc`` route (``available: false``).

The camera: ``POST /rtc/camera/webrtc/offer`` and ``WS /rtc/camera/websocket/offer`` are a second Stream
(``modality="audio-video"``) whose handler is the agent that sees (:mod:`~omni_stream.realtime.agent.rtc_camera`):
a camera track beside the microphone, agent audio and a self-view video track back. It has its own limit of
``Settings.rtc_concurrency_limit`` connections. ``/rtc/config`` says ``camera`` (the camera routes are mounted)
and ``sees`` (the loaded text model takes images: without it the camera's frames are ignored).

With ``--api-key`` the offer routes need the key like every ``/v1`` route (:mod:`omni_stream.realtime.common.auth`):
``Authorization: Bearer KEY``, or on the WebSocket a browser's subprotocols (``realtime`` beside
``openai-insecure-api-key.KEY``; ``realtime`` is echoed, which fastrtc's own accept would not do). ``/rtc/config``
stays open.
"""

from __future__ import annotations

import contextlib
import json
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketState

from omni_stream.realtime.agent.rtc_offer import MAX_OFFER_BYTES, offer_problem
from omni_stream.realtime.common.auth import offered_subprotocols, select_subprotocol
from omni_stream.realtime.common.body_limit import read_body
from omni_stream.realtime.common.close_codes import CloseCode
from omni_stream.realtime.common.errors import ApiError, bad_request
from omni_stream.realtime.state import ServerState

if TYPE_CHECKING:
    from fastrtc import Stream

log = logging.getLogger("omni_stream.realtime.rtc")


def ice_servers(urls: tuple[str, ...]) -> list[dict[str, str]]:
    """``--rtc-ice-servers`` URLs (``stun:host:port``, ``turn:user:pass@host:port``) as RTCIceServer dicts."""
    servers: list[dict[str, str]] = []
    for url in urls:
        scheme, _, rest = url.partition(":")
        if scheme in ("turn", "turns") and "@" in rest:
            credentials, _, host = rest.rpartition("@")
            user, _, password = credentials.partition(":")
            servers.append({"urls": f"{scheme}:{host}", "username": user, "credential": password})
        else:
            servers.append({"urls": url})
    return servers


def make_stream(state: ServerState, camera: bool = False) -> Stream:
    """The fastrtc Stream of the voice agent, or with ``camera`` of the agent that sees (ImportError without
    fastrtc)."""
    from fastrtc import Stream

    from omni_stream.realtime.agent.rtc_camera import SeeingAgentHandler
    from omni_stream.realtime.agent.rtc_handler import VoiceAgentHandler

    settings = state.settings
    config = {"iceServers": ice_servers(settings.rtc_ice_servers)}
    return Stream(
        SeeingAgentHandler(state) if camera else VoiceAgentHandler(state),
        modality="audio-video" if camera else "audio",
        mode="send-receive",
        concurrency_limit=settings.rtc_concurrency_limit,
        server_rtc_configuration=config,
        rtc_configuration=config,
        verbose=False,
    )


def routes(state: ServerState) -> list[BaseRoute]:
    """The ``/rtc`` mount, or nothing when fastrtc is not installed."""
    try:
        stream = make_stream(state)
        camera = make_stream(state, camera=True)
        from fastrtc.stream import Body

        from omni_stream.realtime.agent.rtc_camera import sees
    except ImportError:

        async def unavailable(request: Request) -> Response:
            return JSONResponse({"available": False, "iceServers": [], "camera": False, "sees": False})

        async def no_offers(request: Request) -> Response:  # an offer sent anyway is told why, not a bare 404
            message = (
                "WebRTC is not installed on this server: pip install 'omni-stream[webrtc]' (or use WS /v1/realtime)"
            )
            return ApiError(501, message).response()

        return [
            Route("/rtc/config", unavailable, methods=["GET"]),  # pages ask before they offer WebRTC
            Route("/rtc/webrtc/offer", no_offers, methods=["POST"]),
            Route("/rtc/camera/webrtc/offer", no_offers, methods=["POST"]),
        ]
    state.rtc = stream
    state.rtc_camera = camera

    async def offer(stream: Stream, camera: bool, request: Request) -> Response:
        raw = await read_body(request, MAX_OFFER_BYTES)
        try:
            body = Body(**json.loads(raw))
        except Exception as exc:  # malformed JSON or fields: the OpenAI error shape, never a 500
            errors = getattr(exc, "errors", None)  # pydantic: name each field
            detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors()) if errors else exc
            return bad_request(f"Invalid offer: {detail}".splitlines()[0]).response()
        if not (body.type == "ice-candidate" and body.candidate is not None):
            problem = offer_problem(body.type, body.sdp, camera=camera)
            if problem is not None:
                return bad_request(problem.message, problem.param).response()
        try:
            answer = await stream.offer(body)
        except Exception as exc:  # inside fastrtc, after it took the slot: give the slot back, then say why
            pc = stream.pcs.get(body.webrtc_id)
            stream.clean_up(body.webrtc_id)
            if pc is not None:
                await pc.close()
            log.info("WebRTC offer %s refused: %s", body.webrtc_id, exc)
            return bad_request(f"Invalid offer: {exc}".splitlines()[0], "sdp").response()
        return answer if isinstance(answer, Response) else JSONResponse(answer)

    async def config(request: Request) -> Response:
        servers = ice_servers(state.settings.rtc_ice_servers)
        return JSONResponse({"available": True, "iceServers": servers, "camera": True, "sees": sees(state.engine)})

    async def websocket_offer(stream: Stream, websocket: WebSocket) -> None:
        accept = websocket.accept

        async def accept_echoing(subprotocol: str | None = None, headers: Any = None) -> None:
            # fastrtc accepts with no subprotocol: a browser that offered some would abort the handshake
            chosen = subprotocol or select_subprotocol(offered_subprotocols(websocket.headers))
            await accept(subprotocol=chosen, headers=headers)

        websocket.accept = accept_echoing  # type: ignore[method-assign]
        try:
            await stream.websocket_offer(websocket)
        except Exception as exc:  # fastrtc's handler on a message it cannot read (or a socket closed before its
            # "start"): one log line and a close that says why, not an ASGI traceback and a dropped connection
            log.info("WebRTC websocket ended: %r", exc)
            if websocket.client_state is WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    reason = f"bad message: {exc!r}"[:120]
                    await websocket.close(CloseCode.POLICY, reason)

    return [
        Mount(
            "/rtc",
            routes=[
                Route("/webrtc/offer", partial(offer, stream, False), methods=["POST"]),
                Route("/config", config, methods=["GET"]),
                WebSocketRoute("/websocket/offer", partial(websocket_offer, stream)),
                Route("/camera/webrtc/offer", partial(offer, camera, True), methods=["POST"]),
                WebSocketRoute("/camera/websocket/offer", partial(websocket_offer, camera)),
            ],
        )
    ]
