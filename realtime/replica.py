"""Which replica answered: a response header on every HTTP response and WebSocket handshake, and a label on /metrics.

Used when several replicas serve one address (``Settings.replica_id``), so clients, tests and dashboards can
see how requests were routed and tell each replica's metrics apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-omni-stream-replica"
LABEL = "replica"


class ReplicaHeaderMiddleware:
    """Adds ``x-omni-stream-replica: <id>`` to ``http.response.start`` and ``websocket.accept``."""

    def __init__(self, app: ASGIApp, replica_id: str) -> None:
        self.app = app
        self._header = (HEADER.encode(), replica_id.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", []), self._header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


class ReplicaLabelled(Collector):
    """``registry``'s metrics with a ``replica="<id>"`` label added to every sample."""

    def __init__(self, registry: Collector, replica_id: str) -> None:
        self._registry = registry
        self._replica_id = replica_id

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            labelled = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            labelled.samples = [
                sample._replace(labels={LABEL: self._replica_id, **sample.labels}) for sample in metric.samples
            ]
            yield labelled
