"""The connector's transfer stats as the frontend's stat loggers read them, checked (engine setting
``log_stats``; docs/trace.md "Transfer stats").

With stats on (``Scheduler(log_stats=True)``), every ``update_from_output`` gathers the
connector's stats, the worker's from its ``KVConnectorOutput`` aggregated with the scheduler
side's ``get_kv_connector_stats`` (0.33.0 ``v1/core/sched/scheduler.py:2588-2603``), and hands
them to ``make_stats``, whose ``SchedulerStats`` carries them as a plain dict (``:3281-3299``) in
the ``EngineCoreOutputs`` of one client (``:2661-2674``). The engine core sends that to the
frontend over msgpack, where two stat loggers read it every step: the logging logger's
``KVConnectorLogging`` (0.33.0 ``v1/metrics/loggers.py:239-240`` ->
``kv_connector/v1/metrics.py:65-110``: the connector class's ``build_kv_connector_stats``,
``aggregate``, and ``reduce`` at each log interval) and the Prometheus logger's
``KVConnectorProm`` (``loggers.py:1197-1199``, ``metrics.py:140-177``: ``build_prom_metrics``,
``observe``). Here both run in the worker on each step's ``SchedulerStats``, after vLLM's own
msgpack encoder and decoder carried it (``v1/serial_utils.py``); the Prometheus metrics register as
vLLM's logger registers them, after unregistering the previous engine's (``unregister_vllm_metrics``).

The promise checked: at the end of a run that drained, the bytes the frontend reduces as loaded and
as stored, and the number of size observations of each, are those of the transfers the worker was
told finished (the worker records each finished job's ``transfer_size``, 0.33.0
``offloading/worker.py`` ``get_finished``; the scheduler turns the worker's totals into counters and
a histogram, ``offloading/scheduler.py:2234-2262``), in the logging logger's reduced totals and in
the Prometheus logger's counters alike (``counters``: the flat names of 0.24.0 - 0.33.0, or the
media-keyed stats of 0.21.0 - 0.23.0, whose logging logger reduces bytes only). A mismatch is one
``lifecycle:transfer_stats_mismatch`` per logger and kind.

Planted (tests only, the job's ``mutant``): ``stats_drop_interval``, the connector loses the first
stats it would hand over that count transferred bytes (the scheduler side's ``get_stats`` answers
None once; before 0.24, where the worker side hands them over, its ``get_kv_connector_stats``).
Standard library and vLLM only.
"""

import collections

from . import compose

KIND = "lifecycle:transfer_stats_mismatch"
LABELS = {"model_name": "kvbound", "engine": "0"}  # the Prometheus logger's labels (0.33.0 v1/metrics/loggers.py)


def subscribe(eng, tap):
    """The frontend's loggers on the engine's stats, subscribed to ``tap`` (None: stats are off)."""
    if not eng.par.get("log_stats"):
        return None
    front = FrontendStats(eng)
    front.subscribe(tap)
    return front


Counter = collections.namedtuple("Counter", "logged_bytes logged_count prom_bytes prom_count labels")


def counters():
    """kind ("load", "store") -> where the frontend counts that kind's transfers (a ``Counter``): the
    logging logger's reduced keys (``logged_count`` None where it reduces bytes only) and the
    Prometheus samples with their extra labels. 0.24.0 - 0.33.0 name flat counters
    (``offloading/metrics.py`` ``_TransferMetricName``); 0.21.0 - 0.23.0 key the stats by the
    transfer's media, "GPU_to_CPU" for a store and "CPU_to_GPU" for a load (0.21.0
    ``offloading/metrics.py:47-63`` ``reduce``, ``:124-165`` ``observe``, the worker's
    ``transfer_type`` joined by ``_to_``, ``:69-76``); None where the release has neither."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import metrics

    names = getattr(metrics, "_TransferMetricName", None)
    if names is not None:
        return {kind: Counter(total, size + "_count", total + "_total", size + "_count", {})
                for kind, total, size in (("load", names.LOAD_BYTES, names.LOAD_SIZE),
                                          ("store", names.STORE_BYTES, names.STORE_SIZE))}
    if hasattr(metrics, "OffloadingOperationMetrics"):
        return {kind: Counter(media + "_total_bytes", None, "vllm:kv_offload_total_bytes_total",
                              "vllm:kv_offload_size_count", {"transfer_type": media})
                for kind, media in (("load", "CPU_to_GPU"), ("store", "GPU_to_CPU"))}
    return None


class FrontendStats:
    """The frontend's two connector-stat consumers, fed as the engine core's client feeds them."""

    def __init__(self, eng):
        from vllm.distributed.kv_transfer.kv_connector.v1 import metrics as kvm
        from vllm.v1.metrics import prometheus
        from vllm.v1.metrics.stats import SchedulerStats
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        self.eng = eng
        self.encoder, self.decoder = MsgpackEncoder(), MsgpackDecoder(SchedulerStats)
        self.logging = kvm.KVConnectorLogging(eng.vllm_config.kv_transfer_config)
        # as vLLM's Prometheus logger starts (0.33.0 v1/metrics/loggers.py:490): the previous
        # engine's vllm: collectors of this process unregistered, then this engine's registered
        prometheus.unregister_vllm_metrics()
        self.registry = prometheus.get_prometheus_registry()
        self.prom = kvm.KVConnectorProm(eng.vllm_config, list(LABELS), {0: list(LABELS.values())})
        self.counters = counters()
        self.payloads = 0  # the steps whose SchedulerStats carried connector stats
        self.logged = []  # the log lines the logging logger wrote

    def subscribe(self, tap):
        def update_from_output(call, *a, **k):
            outputs = call(*a, **k)
            for eco in outputs.values():
                if getattr(eco, "scheduler_stats", None) is not None:
                    self.observe(eco.scheduler_stats)
            return outputs

        tap.around(self.eng.sched, "update_from_output", update_from_output)
        if self.eng.mutant == "stats_drop_interval":
            dropped = []

            flat = hasattr(self.eng.csched, "get_stats")

            def get_stats(call, *a, **k):
                stats = call(*a, **k)
                # before 0.24 only the worker's transfers are in them, as objects its reduce refuses
                # until msgpack made them dicts (docs/findings.md)
                if stats is not None and not dropped and (
                        any(stats.reduce().get(c.logged_bytes) for c in self.counters.values()) if flat
                        else not stats.is_empty()):
                    dropped.append(stats)
                    return None
                return stats

            if flat:
                tap.around(self.eng.csched, "get_stats", get_stats)
            else:  # before 0.24 the worker side hands them over
                tap.around(self.eng.wconn.connector_worker, "get_kv_connector_stats", get_stats)

    def observe(self, scheduler_stats):
        received = self.decoder.decode(self.encoder.encode(scheduler_stats))  # engine core -> frontend
        data = received.kv_connector_stats
        if data:
            self.payloads += 1
            self.logging.observe(data)
        if data is not None:
            self.prom.observe(data, 0)

    def totals(self):
        """The OffloadingConnector's reduced stats of the run so far (a MultiConnector's reduce
        holds each child's under its class name)."""
        acc = self.logging.transfer_stats_accumulator
        reduced = acc.reduce() if acc is not None and not acc.is_empty() else {}
        inner = reduced.get(compose.OFFLOADING)
        return inner if isinstance(inner, dict) else reduced

    def prometheus(self, name, labels):
        """The value of the Prometheus sample ``name`` of this engine with the extra ``labels`` (0
        where none was recorded)."""
        return self.registry.get_sample_value(name, dict(LABELS, **labels)) or 0

    def check(self, reported):
        """At the end of a drained run: the logging logger's totals and the Prometheus logger's
        counters against ``reported`` (kind -> the sizes of the finished jobs the transfer engine
        reported, ``fakes``); then the log interval's summary is written as the logger writes it."""
        got = self.totals()
        self.logging.log(log_fn=lambda fmt, *a: self.logged.append(fmt % a))
        if self.counters is None or self.eng.stopped:
            return
        self.eng.stats.update(frontend_payloads=self.payloads,
                              frontend_load_bytes=got.get(self.counters["load"].logged_bytes, 0),
                              frontend_store_bytes=got.get(self.counters["store"].logged_bytes, 0))
        for kind, c in self.counters.items():
            sizes = reported.get(kind, ())
            want = (sum(sizes), len(sizes))
            for logger, have in (("logging", (got.get(c.logged_bytes, 0),
                                              got.get(c.logged_count, 0) if c.logged_count else None)),
                                 ("Prometheus", (self.prometheus(c.prom_bytes, c.labels),
                                                 self.prometheus(c.prom_count, c.labels)))):
                if have != want[:1] + (want[1] if have[1] is not None else None,):
                    self.eng.violate(KIND, None, "the frontend's %s logger counts %d %s bytes in %s transfers; the"
                                     " worker was told %d bytes in %d finished %s jobs (%s, %s; %d payloads)"
                                     % (logger, have[0], kind, "?" if have[1] is None else have[1], want[0],
                                        want[1], kind, c.logged_bytes, c.prom_count, self.payloads))
