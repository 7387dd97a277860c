"""What a WebRTC offer to the voice agent must hold before fastrtc sees it (pure: no I/O).

fastrtc takes a connection's slot before it parses the offer's SDP, and frees it only once the peer connection
ends; an offer that fails inside it (no SDP, an answer for an offer, a camera track on the audio-only route, text
that is no SDP) kept its slot for good or for fastrtc's 30 s timeout, so a few bad offers shut WebRTC out. So the
route refuses them first, as a 400 naming the field, and an offer that still fails inside fastrtc is cleaned up
there (:mod:`~omni_stream.realtime.agent.rtc`).

What the agent needs: an ``offer`` whose SDP (``v=0`` first) carries the ICE credentials, a microphone the client
sends (an ``m=audio`` section that is not ``recvonly`` or ``inactive``), the data channel the agent's events go
over (``m=application``: fastrtc starts the agent once it is up), and on the audio-only route no camera.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_OFFER_BYTES = 256 * 1024  # an offer's JSON body: an SDP is a few kB, with every candidate gathered a few tens


@dataclass(slots=True, frozen=True)
class OfferProblem:
    message: str
    param: str


def _sections(sdp: str) -> list[list[str]]:
    """The SDP's media sections, each as its lines (its ``m=`` line first)."""
    sections: list[list[str]] = []
    for line in sdp.replace("\r\n", "\n").split("\n"):
        if line.startswith("m="):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    return sections


def offer_problem(kind: object, sdp: object, *, camera: bool) -> OfferProblem | None:
    """Why an offer (fastrtc's ``type`` and ``sdp``) cannot start the agent, or None; ``camera``: the route that
    takes a camera track beside the microphone."""
    if kind != "offer":
        return OfferProblem(f"'type' must be 'offer' (or 'ice-candidate' with a candidate), got {kind!r}", "type")
    if not isinstance(sdp, str) or not sdp.strip():
        return OfferProblem("'sdp' is required: the offer's session description", "sdp")
    if not sdp.lstrip().startswith("v=0"):
        return OfferProblem("'sdp' is not a session description (it starts with v=0)", "sdp")
    if "a=ice-ufrag:" not in sdp or "a=ice-pwd:" not in sdp:
        return OfferProblem("'sdp' has no ICE credentials (a=ice-ufrag, a=ice-pwd)", "sdp")
    sections = _sections(sdp)
    media = [s[0].split()[0].removeprefix("m=") for s in sections]
    if "video" in media and not camera:
        return OfferProblem(
            "'sdp' offers a camera (m=video): the voice agent takes a microphone only; send a camera to "
            "/rtc/camera/webrtc/offer",
            "sdp",
        )
    audio = [s for s in sections if s[0].startswith("m=audio")]
    if not audio:
        return OfferProblem("'sdp' offers no microphone (m=audio): the agent listens to it", "sdp")
    if all(any(line.strip() in ("a=recvonly", "a=inactive") for line in s) for s in audio):
        return OfferProblem("'sdp' offers audio the client does not send (recvonly): the agent needs the microphone",
                            "sdp")  # fmt: skip
    if "application" not in media:
        return OfferProblem(
            "'sdp' has no data channel (m=application): open one before the offer; the agent's events go over it",
            "sdp",
        )
    return None
