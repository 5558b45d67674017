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

The promise checked, where the release's stats name flat transfer counters (its offloading
``metrics._TransferMetricName``, 0.24.0 - 0.33.0): at the end of a run that drained, the bytes the
frontend reduces as loaded and as stored, and the number of size observations of each, are those
of the transfers the worker was told finished (the worker records each finished job's
``transfer_size``, 0.33.0 ``offloading/worker.py`` ``get_finished``; the scheduler turns the
worker's totals into counters and a histogram, ``offloading/scheduler.py:2234-2262``), in the
logging logger's reduced totals and in the Prometheus logger's counters alike. A mismatch is one
``lifecycle:transfer_stats_mismatch`` per logger and kind. Before 0.24 the loggers run and nothing is compared
(the stats are keyed by the transfer's media, which the fake transfer engine does not report).

Planted (tests only, the job's ``mutant``): ``stats_drop_interval``, the connector's scheduler
side loses the first stats it would hand over that count transferred bytes (``get_stats`` answers
None once).
Standard library and vLLM only.
"""

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


def flat_counters():
    """(load bytes, store bytes, load size, store size): the release's metric names of the
    connector's transfer counters and histograms, or None where it has no flat names."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import metrics

    names = getattr(metrics, "_TransferMetricName", None)
    if names is None:
        return None
    return names.LOAD_BYTES, names.STORE_BYTES, names.LOAD_SIZE, names.STORE_SIZE


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
        self.names = flat_counters()
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

            def get_stats(call, *a, **k):
                stats = call(*a, **k)
                if stats is not None and not dropped and any(stats.reduce().get(n) for n in self.names[:2]):
                    dropped.append(stats)
                    return None
                return stats

            tap.around(self.eng.csched, "get_stats", get_stats)

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

    def prometheus(self, name):
        """The value of the Prometheus sample ``name`` of this engine (0 where none was recorded)."""
        return self.registry.get_sample_value(name, LABELS) or 0

    def check(self, reported):
        """At the end of a drained run: the logging logger's totals and the Prometheus logger's
        counters against ``reported`` (kind -> the sizes of the finished jobs the transfer engine
        reported, ``fakes``); then the log interval's summary is written as the logger writes it."""
        got = self.totals()
        self.logging.log(log_fn=lambda fmt, *a: self.logged.append(fmt % a))
        if self.names is None or any(v["check"] == "lifecycle:not_drained" for v in self.eng.violations):
            return
        load_bytes, store_bytes, load_size, store_size = self.names
        self.eng.stats.update(frontend_payloads=self.payloads, frontend_load_bytes=got.get(load_bytes, 0),
                              frontend_store_bytes=got.get(store_bytes, 0))
        for kind, total, count in (("load", load_bytes, load_size), ("store", store_bytes, store_size)):
            sizes = reported.get(kind, ())
            want = (sum(sizes), len(sizes))
            for logger, have in (("logging", (got.get(total, 0), got.get(count + "_count", 0))),
                                 ("Prometheus", (self.prometheus(total + "_total"), self.prometheus(count + "_count")))):
                if have != want:
                    self.eng.violate(KIND, None, "the frontend's %s logger counts %d %s bytes in %d transfers; the"
                                     " worker was told %d bytes in %d finished %s jobs (%s, %s; %d payloads)"
                                     % (logger, have[0], kind, have[1], want[0], want[1], kind, total, count,
                                        self.payloads))
