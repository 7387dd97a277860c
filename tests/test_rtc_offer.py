"""The checks a WebRTC offer passes before fastrtc takes a slot for it (pure; the routes' tests are in the WebRTC
tier, ``test_realtime_webrtc.py``)."""

from __future__ import annotations

import pytest

from omni_stream.realtime.agent.rtc_offer import offer_problem

HEAD = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
ICE = "a=ice-ufrag:abcd\r\na=ice-pwd:0123456789abcdefghijkl\r\n"
MIC = "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\n" + ICE + "a=sendrecv\r\na=rtpmap:111 opus/48000/2\r\n"
CAMERA = "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\n" + ICE + "a=sendrecv\r\na=rtpmap:96 VP8/90000\r\n"
CHANNEL = "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\n" + ICE


def test_a_microphone_with_a_data_channel_is_an_offer_and_a_camera_only_where_the_route_takes_one():
    assert offer_problem("offer", HEAD + MIC + CHANNEL, camera=False) is None
    assert offer_problem("offer", HEAD + MIC + CAMERA + CHANNEL, camera=True) is None
    problem = offer_problem("offer", HEAD + MIC + CAMERA + CHANNEL, camera=False)
    assert problem is not None and problem.param == "sdp" and "/rtc/camera/webrtc/offer" in problem.message


@pytest.mark.parametrize(
    ("kind", "sdp", "param", "words"),
    [
        ("answer", HEAD + MIC + CHANNEL, "type", "'offer'"),
        ("offer", None, "sdp", "required"),
        ("offer", "  ", "sdp", "required"),
        ("offer", "this is not sdp", "sdp", "session description"),
        ("offer", HEAD + MIC.replace(ICE, "") + CHANNEL.replace(ICE, ""), "sdp", "ICE credentials"),
        ("offer", HEAD + CAMERA + CHANNEL, "sdp", "camera"),  # the audio route: the camera is named first
        ("offer", HEAD + CHANNEL, "sdp", "no microphone"),
        ("offer", HEAD + MIC.replace("a=sendrecv", "a=recvonly") + CHANNEL, "sdp", "recvonly"),
        ("offer", HEAD + MIC, "sdp", "data channel"),
    ],
)
def test_an_offer_that_cannot_start_the_agent_is_named(kind, sdp, param, words):
    problem = offer_problem(kind, sdp, camera=False)
    assert problem is not None and problem.param == param and words in problem.message, problem
