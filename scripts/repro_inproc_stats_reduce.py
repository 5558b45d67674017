"""Reproducer of a suspected defect of 0.21.0 - 0.23.0 (docs/findings.md, "the connector's transfer
stats in an in-process frontend"): the OffloadingConnector's worker records each finished transfer
as an ``OffloadingOperationMetrics`` dataclass (0.21.0
``kv_connector/v1/offloading/metrics.py:66-73`` ``record_transfer``), while ``reduce`` asserts every
observation is a dict (``:55-59``). Over the default multiprocess engine the stats reach the
frontend through msgpack, which turns the dataclasses into dicts, and the logging stat logger
logs them; an engine core run in the frontend's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
the in-process client hands ``EngineCoreOutputs`` over as objects) hands the dataclasses on, and
the logger's ``KVConnectorLogging.log`` (``kv_connector/v1/metrics.py``) raises in ``reduce`` at its
first log interval after a transfer.

What it runs: one load's stats as the worker records them, handed to the release's
``KVConnectorLogging`` twice, once through vLLM's msgpack encoder and decoder (the multiprocess
path) and once as the objects (the in-process path), then each logger's ``log``. The engine itself
is not run in process here. 0.24.0 replaced the stats with flat counters (``_TransferMetricName``);
from there the same two paths are run with the release's own counters.

Run with the release's side interpreter and tree (kvbound conform prepares them):
    PYTHONPATH=~/.cache/kvbound/vllm-0.23.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_inproc_stats_reduce.py [--json]
Prints one JSON line with --json. Exit 1 when the in-process path raises where the msgpack path
logs (the finding), else 0.
"""
import json
import sys
import traceback

import vllm
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import metrics as kvm
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import metrics as om
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder


def worker_stats():
    """One finished load of 4096 bytes, as the release's worker records it."""
    st = om.OffloadingConnectorStats()
    if hasattr(st, "record_transfer"):  # 0.21.0 - 0.23.0: keyed by the transfer's media
        st.record_transfer(4096, 0.001, ("CPU", "GPU"))
    else:  # 0.24.0 on: the scheduler's flat counters
        names = om._TransferMetricName
        st.increase_counter(names.LOAD_BYTES, 4096)
        st.observe_histogram(names.LOAD_SIZE, 4096)
    return st


def logged(data):
    """What the logging stat logger writes for ``data``, or the site it raised at."""
    lines = []
    lg = kvm.KVConnectorLogging(KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both"))
    lg.observe(data)
    try:
        lg.log(log_fn=lambda fmt, *a: lines.append(fmt % a))
    except AssertionError as e:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return {"raised": "AssertionError", "at": "%s:%d %s" % (frame.filename.split("/vllm/", 1)[-1],
                                                                 frame.lineno, frame.line)}
    return {"logged": lines}


def main():
    data = worker_stats().data
    over_ipc = MsgpackDecoder(SchedulerStats).decode(
        MsgpackEncoder().encode(SchedulerStats(kv_connector_stats=data))).kv_connector_stats
    res = {"vllm": vllm.__version__, "multiprocess": logged(over_ipc), "in_process": logged(data)}
    bad = "raised" in res["in_process"] and "logged" in res["multiprocess"]
    print(json.dumps(res) if "--json" in sys.argv else
          "%s: multiprocess %s; in process %s -> %s" % (res["vllm"], res["multiprocess"], res["in_process"],
                                                        "FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
