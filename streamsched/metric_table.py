"""The declared metric vocabulary: every family the package updates, with its type, labels and
HELP text, and the generated reference (docs/metrics.md).

Split from :mod:`streamsched.metrics` (the registry that serves them): the HELP text, the metrics
reference, the Grafana dashboard and the alert rules in deploy/ are all checked against this one
table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, TypeAlias

__all__ = ["METRICS", "PREFIX", "SAMPLE_SUFFIXES", "Declared", "MetricType", "declared", "help_text",
           "reference_markdown"]

PREFIX: Final = "streamsched_"
"""Prefix of every exported family name."""

MetricType: TypeAlias = Literal["counter", "gauge", "histogram"]
"""Type of a metric family (the method that updates it: ``inc``, ``set_gauge``, ``observe``)."""
SAMPLE_SUFFIXES: Final[Mapping[str, tuple[str, ...]]] = {
    "counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
"""Suffixes of the samples a scrape shows for a family of each type."""


@dataclass(frozen=True, slots=True)
class Declared:
    """One metric family as declared: ``name`` (without :data:`PREFIX`), type, its labels
    besides ``scheduler``, and the HELP text served for it."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    help: str

    @property
    def samples(self) -> tuple[str, ...]:
        """Full sample names a scrape shows (``streamsched_claims_total``, ``..._bucket``, ...)."""
        return tuple(PREFIX + self.name + s for s in SAMPLE_SUFFIXES[self.type])


# Every name the worker, ticker and outbox relay update, declared once: HELP text, the metrics
# reference (docs/metrics.md), the dashboard and the alert rules are all checked against this.
_P, _K, _R = ("partition",), ("kind",), ("reason",)
_TABLE: Final[tuple[tuple[str, MetricType, tuple[str, ...], str], ...]] = (
    # Turns (worker)
    ("records", "counter", (), "records selected into turns"),
    ("turns", "counter", (), "turns (leading items) started"),
    ("claims", "counter", (), "claims written"),
    ("releases", "counter", (), "claims released"),
    ("committed", "counter", (), "records whose offset was committed"),
    ("executions", "counter", (), "command executions"),
    ("skipped_outcome", "counter", (), "items skipped because their outcome was already stored"),
    ("retries", "counter", (), "in-place retries"),
    ("retries_parked", "counter", (), "retries parked on the delay topic"),
    ("terminal", "counter", _K, "terminal failures by kind"),
    ("dead_lettered", "counter", (), "records dead-lettered"),
    ("attempts_exhausted", "counter", (), "items dead-lettered after the delivery-attempt bound"),
    ("deferred_until_due", "counter", (), "items deferred until their due time"),
    ("duplicates_in_batch", "counter", (), "records folded into an earlier copy in the same batch"),
    ("retry_joined", "counter", (), "records that joined their identity's parked retry instead of running"),
    ("fetched_duplicates", "counter", (), "records fetched twice in one fetch sequence, dropped"),
    ("lease_waits", "counter", (), "items waiting for another owner's claim lease to expire"),
    ("tenant_deferred", "counter", (),
     "records parked because their tenant held its share of the partition's in-flight slots"),
    ("parked", "counter", (), "items parked on the delay topic"),
    ("forwarded", "counter", (), "records forwarded to the partition their key maps to"),
    ("redriven", "counter", (), "identities reopened by an operator's re-drive"),
    ("redrive_refused", "counter", _K, "re-drive requests the owner refused, by kind (changed, live_claim)"),
    ("cancelled", "counter", (), "identities whose waiting work an operator's cancel resolved"),
    ("cancel_refused", "counter", _K, "cancel requests the owner refused, by kind (changed, live_claim, "
     "nothing_waiting)"),
    ("feedback_dropped", "counter", (), "schedule feedback with no catalog to report to"),
    ("lag", "gauge", (), "records behind the end of the assigned partitions"),
    ("due_items", "gauge", (), "items waiting for their due time"),
    ("committed_offset", "gauge", _P, "committed offset by partition"),
    ("partition_stopped", "gauge", ("kind", "partition", "reason"),
     "1 while a partition is stopped at a record batch that cannot be decoded (reason: codec)"),
    ("partition_stopped_offset", "gauge", ("kind", "partition"),
     "offset of the first record a stopped partition cannot decode"),
    ("turn_seconds", "histogram", (), "duration of a turn per batch (selection to its resolving commit)"),
    # Flow control (worker)
    ("breaker_state", "gauge", _K,
     "circuit breaker state by scope (scheduler or the command): 0 closed, 1 half-open, 2 open"),
    ("breaker_opened", "counter", _K, "times a circuit breaker opened, by scope"),
    ("breaker_deferred", "counter", (), "items deferred without charging an attempt (a breaker was open)"),
    ("rate_budget", "gauge", _K,
     "calls per second this worker may make under a group-wide rate limit (its share), by scope"),
    ("paused", "gauge", (),
     "1 while an operator has paused the scheduler (or its pause state is still being read); else 0"),
    # Partition owners, transactions and restores (worker and ticker)
    ("errors", "counter", _K, "errors by kind (the latest one is in /status as type and kind)"),
    ("fenced", "counter", (), "times a producer was fenced by a newer owner"),
    ("fences_unconfirmed", "counter", (), "fenced owners restarted because no revoke followed the fence"),
    ("stuck_transactions", "counter", (), "transactions given up at their deadline (the owner restarts)"),
    ("partition_restarts", "counter", (), "partition owner restarts"),
    ("round_restarts", "counter", (), "owners restarted at once because a transaction they shared aborted"),
    ("partitions", "gauge", (), "partitions owned"),
    ("producers_live", "gauge", (), "transactional producers open"),
    ("partition_given_up", "gauge", _P, "1 while a partition's owner has given up restarting, by partition"),
    ("store_unwritable", "gauge", _P,
     "1 while a partition's local claim store cannot be written (disk full, read-only); 0 once restored"),
    ("store_memory_bytes", "gauge", ("kind",),
     "memory of the local claim stores: RocksDB's shared block_cache and memtables, decoded snapshots"),
    ("registry_waiting", "gauge", _P,
     "1 while a partition waits for the schema registry (unreachable, failing); 0 once it answers"),
    ("state_corrupt_records", "counter", _P, "state records that could not be decoded"),
    ("restored_identities", "counter", (), "claim states restored at partition start"),
    ("restores", "counter", _K, "partition restores started, by kind of state"),
    ("restore_records", "counter", _P, "records read by restores"),
    ("restore_remaining", "gauge", _P, "records left to read by a partition's restore (0 when done)"),
    ("restore_seconds", "histogram", _P, "duration of a partition's restore"),
    ("ready", "gauge", (), "1 while the process answers /readyz with 200 (set when scraped)"),
    # Schedules (ticker)
    ("occurrences_fired", "counter", (), "schedule occurrences fired"),
    ("history_rows", "counter", (), "schedule history rows written"),
    ("overlap_skipped", "counter", (), "schedule boundaries skipped: the previous run had not resolved"),
    ("late_plans", "counter", (), "fire transactions committed after their planned time"),
    ("undecodable_records", "counter", _K, "records that could not be decoded"),
    ("schedule_requests_dropped", "counter", _R, "schedule operator requests dropped, by reason"),
    ("feedback_rejected", "counter", (), "schedule feedback refused (not an occurrence the ticker fired)"),
    ("feedback_stale", "counter", (), "schedule feedback for an older version or an unknown schedule"),
    ("schedules_held", "gauge", _P, "schedules held by a ticker partition"),
    ("targets_unwritable", "gauge", _P, "target topics a ticker partition cannot write (schedules wait)"),
    ("commit_after_planned_seconds", "histogram", (),
     "delay from an occurrence's planned time to its commit"),
    ("end_txn_seconds", "histogram", (), "duration of committing a transaction"),
    # Outbox relay
    ("outbox_claimed", "counter", (), "outbox intents claimed by the relay"),
    ("outbox_delivered", "counter", (), "outbox intents delivered to Kafka"),
    ("outbox_retries", "counter", _K, "failed outbox deliveries rescheduled, by kind of failure"),
    ("outbox_dead", "counter", _K, "outbox intents given up (dead), by kind of failure"),
    ("outbox_lease_lost", "counter", (), "failed outbox deliveries whose lease another relay had taken"),
    ("outbox_relay_errors", "counter", _K, "outbox relay rounds that failed, by kind"),
    ("outbox_pending", "gauge", (), "outbox intents waiting for delivery"),
    ("outbox_leased", "gauge", (), "outbox intents leased by a relay"),
    ("outbox_dead_intents", "gauge", (), "outbox intents given up, in the table"),
    ("outbox_deliver_seconds", "histogram", (), "duration of one successful outbox delivery"),
    # The metrics themselves
    ("metrics_dropped", "counter", _R, "metric updates dropped (outside the vocabulary or past a bound)"),
)
METRICS: Final[Mapping[str, Declared]] = MappingProxyType(
    {name: Declared(name, mtype, labels, doc) for name, mtype, labels, doc in _TABLE})
"""Every declared metric family by name (without :data:`PREFIX`)."""


def declared() -> Mapping[str, Declared]:
    """:data:`METRICS`: the declaration the dashboards, alerts and docs/metrics.md are checked against."""
    return METRICS


def help_text(name: str, mtype: str) -> str:
    """HELP line of family ``name``: fixed text, never taken from a registry or a caller."""
    d = METRICS.get(name)
    return d.help if d is not None else f"streamsched {mtype} {name}"


def reference_markdown() -> str:
    """docs/metrics.md, generated from :data:`METRICS` (``make metrics-doc`` writes it)."""
    head = ("# Metrics reference\n\n"
            "Generated from `streamsched.metrics.METRICS` by `make metrics-doc`; do not edit by hand.\n\n"
            "Every series also carries the `scheduler` label (the scheduler name, or `ticker.<catalog>`"
            " for a ticker). Counters are served with the `_total` suffix; histograms (seconds) as"
            " `_bucket`, `_sum` and `_count`. Labels: `partition` (a partition number), `kind` and"
            " `reason` (short lowercase words). The Grafana dashboard is"
            " `deploy/grafana/streamsched.json`, the alert rules"
            " `deploy/prometheus/streamsched-alerts.yml`.\n\n"
            "| Metric | Type | Labels | Meaning |\n|---|---|---|---|\n")
    rows = [f"| `{d.samples[0] if d.type == 'counter' else PREFIX + d.name}` | {d.type} "
            f"| {', '.join(f'`{label}`' for label in d.labels) or '-'} | {d.help} |\n"
            for d in sorted(METRICS.values(), key=lambda d: d.name)]
    return head + "".join(rows)
