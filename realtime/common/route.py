"""One HTTP route's answer: its handler's response, or the error's in the OpenAI shape, counted in ``/metrics``.

Every JSON/multipart route answers the same way: an exception anywhere in the handler (a refused field, a body over
its limit, an engine error) becomes :func:`~omni_stream.realtime.common.errors.from_exception`'s response after
the rest of an over-limit body is drained (so the client reads the answer), and the answer's status is counted
under the route's name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from omni_stream.realtime.common.body_limit import drain
from omni_stream.realtime.common.errors import from_exception
from omni_stream.realtime.state import ServerState

Handler = Callable[[Request, ServerState], Awaitable[Response]]


async def answer(request: Request, route: str, handler: Handler) -> Response:
    """``handler(request, state)``'s response, or the error it raised as a response; counted under ``route``."""
    state: ServerState = request.app.state.omni
    try:
        response = await handler(request, state)
    except Exception as exc:
        await drain(request.receive, exc)
        response = from_exception(exc).response()
    count(state, route, response)
    return response


def count(state: ServerState, route: str, response: Response) -> Response:
    """Count ``response``'s status under ``route`` (``omni_stream_requests_total``) and return it."""
    state.metrics.requests.labels(route, str(response.status_code)).inc()
    return response
