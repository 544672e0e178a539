"""Status of a running worker or ticker: redaction, Prometheus exposition, HTTP server, client.

* :mod:`.redact`     rebuilds status documents from known-safe parts (used by all the others)
* :mod:`.exposition` the ``/metrics`` page: per-scheduler registries merged and re-validated
* :mod:`.server`     :class:`StatusServer` (aiohttp): ``/metrics``, ``/status``, ``/healthz``, ``/readyz``
* :mod:`.client`     :func:`fetch_status` (aiohttp) for ``streamsched status``
* :mod:`.table`      :func:`format_status`, the table ``streamsched status`` prints

May import ``streamsched.metrics``, ``streamsched.errors`` and ``streamsched.model``; nothing in
the runtime (``worker``, ``schedules``, ``kafka``) imports this package: the CLI wires a
service's :class:`~streamsched.metrics.Metrics` and readiness into a :class:`StatusServer`.
"""

from streamsched.ops.status.client import StatusUnavailable, fetch_status
from streamsched.ops.status.exposition import render_prometheus
from streamsched.ops.status.redact import redact_snapshot, redact_status
from streamsched.ops.status.server import DEFAULT_HOST, StatusServer
from streamsched.ops.status.table import format_status

__all__ = [
    "DEFAULT_HOST",
    "StatusServer",
    "StatusUnavailable",
    "fetch_status",
    "format_status",
    "redact_snapshot",
    "redact_status",
    "render_prometheus",
]
