"""Prometheus text metrics: request counts and latencies per route, store size, outbox depth."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Metrics:
    def __init__(self) -> None:
        self.requests: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self.latency: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def middleware(self) -> web.middleware:  # type: ignore[valid-type]
        @web.middleware
        async def measure(request: web.Request, handler: Handler) -> web.StreamResponse:
            started = time.perf_counter()
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                route = request.match_info.route.resource
                name = route.canonical if route is not None else "unmatched"
                self.requests[(name, request.method, status)] += 1
                total = self.latency[name]
                total[0] += time.perf_counter() - started
                total[1] += 1

        return measure

    def render(self, gauges: dict[str, float]) -> str:
        lines = ["# TYPE syncd_http_requests_total counter"]
        for (route, method, status), count in sorted(self.requests.items()):
            lines.append(f'syncd_http_requests_total{{route="{route}",method="{method}",'
                         f'status="{status}"}} {count}')
        lines.append("# TYPE syncd_http_request_duration_seconds summary")
        for route, (seconds, calls) in sorted(self.latency.items()):
            lines.append(f'syncd_http_request_duration_seconds_sum{{route="{route}"}} {seconds:.6f}')
            lines.append(f'syncd_http_request_duration_seconds_count{{route="{route}"}} {calls:.0f}')
        for name, value in sorted(gauges.items()):
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {value:g}")
        return "\n".join(lines) + "\n"
