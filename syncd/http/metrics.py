"""Prometheus text exposition (format 0.0.4) for the daemon's and the hub's ``/metrics``.

Rules:
  * Every label comes from a closed set, so no client can grow the page: ``route`` is the
    matched route's canonical path from the app's own route table (``unmatched`` for any other
    path — never the raw path), ``method`` one of ``KNOWN_METHODS`` (any other is ``other``),
    ``status`` the answer's status code.
  * A request is counted by route only once the app's guards let it in (``admit``) and its
    answer is not a 401. Any other request — a wrong Host or Origin, no or a wrong credential,
    a role too low — adds one to the unlabelled ``syncd_http_unauthorized_total`` and nothing
    else: a client without credentials changes one number, never the set of series. Except a
    5xx: a guard that could not check a credential (the hub's database down) is an outage,
    counted by route so that it shows; its labels are from the same closed sets.
  * Values are exact: an ``int`` is printed in full (``123456789``, not ``1.23457e+08``), a
    ``float`` as its shortest round-trip ``repr``.
  * Every metric has its ``# HELP`` and ``# TYPE`` lines, even before it has a sample.
  * Counters are plain dicts in one ``Metrics`` per app, never process-global, so several apps
    in one process (tests, a hub beside a daemon) never share a series.

Hand-written rather than ``prometheus_client``: a handful of metrics, gauges read from the store
at scrape time (an ``await``, which a synchronous collector cannot do), and no global registry
or ``_created`` series to switch off; the tests read the page with ``prometheus_client``'s parser.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
                           "CONNECT", "TRACE"})  # RFC 9110's methods and PATCH (RFC 5789)
OTHER_METHOD = "other"
UNMATCHED = "unmatched"
ADMITTED = web.RequestKey("metrics_admitted", bool)

# (stats key, metric, help): the store's counts as gauges, on the daemon and the hub alike
STORE_GAUGES = [
    ("memories", "syncd_store_memories", "Memories in the store, tombstones not counted."),
    ("tombstones", "syncd_store_tombstones",
     "Deleted memories kept as tombstones, so that the delete replicates."),
    ("edges", "syncd_store_edges", "Edges between memories, deleted ones not counted."),
]
OUTBOX_GAUGE = ("outbox", "syncd_outbox_depth",
                "Changes in the outbox, not yet pushed to the control plane.")
BYTES_HELP = "Bytes on disk of the SQLite database and its WAL and shared-memory files."


@dataclass(frozen=True)
class Family:
    """One metric: its ``# HELP``/``# TYPE`` lines and samples of (name suffix, labels, value)."""

    name: str
    kind: str  # counter, gauge or summary
    help: str
    samples: Sequence[tuple[str, Mapping[str, str], int | float]] = field(default=())


def gauge(name: str, help: str, value: int | float) -> Family:
    return Family(name, "gauge", help, [("", {}, value)])


def format_value(value: int | float) -> str:
    """A sample's value, exactly: ``123456789`` → ``123456789``; ``0.25`` → ``0.25``."""
    if isinstance(value, int):  # bool too: 1 or 0
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)  # the shortest text that reads back as the same float


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def render(families: Iterable[Family]) -> str:
    lines: list[str] = []
    for family in families:
        lines += [f"# HELP {family.name} {escape_help(family.help)}",
                  f"# TYPE {family.name} {family.kind}"]
        for suffix, labels, value in family.samples:
            shown = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{family.name}{suffix}{'{' + shown + '}' if shown else ''} "
                         f"{format_value(value)}")
    return "\n".join(lines) + "\n"


def page(families: Iterable[Family]) -> web.Response:
    return web.Response(body=render(families).encode(), headers={"Content-Type": CONTENT_TYPE})


def store_gauges(stats: Mapping[str, int], disk_bytes: int | None = None, *,
                 outbox: bool = True) -> list[Family]:
    """The store's counts (``Store.stats``/``HubStore.stats``), its size when it has a file,
    and the outbox (a hub pushes nowhere: ``outbox=False``)."""
    table = [*STORE_GAUGES, OUTBOX_GAUGE] if outbox else STORE_GAUGES
    found = [gauge(name, help, stats[key]) for key, name, help in table if key in stats]
    if disk_bytes is not None:
        found.append(gauge("syncd_store_bytes", BYTES_HELP, disk_bytes))
    return found


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else OTHER_METHOD


def route_label(request: web.Request) -> str:
    """The matched route's canonical path (``/v1/agent/memory/items/{id}``), never the path."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED


def admit(request: web.Request) -> None:
    """Called by an app's guards as they let a request through: only then is it counted by
    route, method and status."""
    request[ADMITTED] = True


class Metrics:
    """One app's request counters and latencies (see the module's rules)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.latency: dict[str, tuple[float, int]] = {}
        self.unauthorized = 0

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests[(route, method_label(method), status)] += 1
        total, calls = self.latency.get(route, (0.0, 0))
        self.latency[route] = (total + seconds, calls + 1)

    def middleware(self) -> Middleware:
        @web.middleware
        async def measure(request: web.Request, handler: Handler) -> web.StreamResponse:
            started, status = self._clock(), 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                if status >= 500 or (request.get(ADMITTED, False) and status != 401):
                    self.observe(route_label(request), request.method, status,
                                 self._clock() - started)
                else:
                    self.unauthorized += 1

        return measure

    def page(self, gauges: Iterable[Family] = ()) -> web.Response:
        """The ``/metrics`` answer: this app's HTTP metrics, then ``gauges``."""
        return page([*self.families(), *gauges])

    def families(self) -> list[Family]:
        return [
            Family("syncd_http_requests_total", "counter",
                   "HTTP requests answered, by matched route, method and status.",
                   [("", {"route": r, "method": m, "status": str(s)}, n)
                    for (r, m, s), n in sorted(self.requests.items())]),
            Family("syncd_http_request_duration_seconds", "summary",
                   "Time spent answering HTTP requests, by matched route.",
                   [sample for route, (seconds, calls) in sorted(self.latency.items())
                    for sample in (("_sum", {"route": route}, seconds),
                                   ("_count", {"route": route}, calls))]),
            Family("syncd_http_unauthorized_total", "counter",
                   "Requests refused before a handler ran (wrong Host or Origin, no or a wrong "
                   "credential, a role too low) and 401 answers; never labelled.",
                   [("", {}, self.unauthorized)]),
        ]
