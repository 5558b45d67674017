"""kvbound trace's worker: one job (a layout, its engine parameters, a workload) per message.

Part of the side package (``worker.py trace`` serves it): runs with ``PYTHONPATH=<release
tree>`` in the deps venv, where kvbound is NOT installed: standard library, vLLM and the side
package only.

Protocol: a hello line, then one JSON job per stdin line -> one JSON result line.
A job's outcome is ``ok``, or a vLLM exception (raised inside vLLM's code: a finding), or
a harness fault (raised in kvbound's own fakes or adapter: never a vLLM finding).

A job with ``"coverage": true`` also returns the lines of the connector code it ran
(``cover.py``), recorded by the probes compiled into the connector's modules, no trace function
(``cover.probed``); ``"coverage": "job"``, the same lines traced by coverage.py over the whole
job (the reference: tests/test_coverage.py compares them). The worker
must have been started to measure (``cover.ENV``). Every result carries ``step_cpu``: the worker's
process CPU seconds since the job began, at the start of each step (the host's time to detect).
"""

import time

from . import compose, cover, failed_start, findings, runner_calls, sidecar


def run_job(rel, job):
    if job.get("coverage") not in (None, False, True, "job"):
        raise ValueError("a job's coverage is true, \"job\" or absent, not %r" % (job["coverage"],))
    probe = getattr(rel, "coverage_probe", None) if job.get("coverage") else None
    if job.get("coverage") and probe is None:
        raise RuntimeError("the job asks for coverage of a worker started without it (%s=1)" % cover.ENV)
    t0, c0 = time.monotonic(), time.process_time()
    if probe is not None:
        # before the build: what its engine imports and runs counts
        probe.start("job" if job["coverage"] == "job" else "probes", plant=job.get("coverage_plant"))
    try:
        res = _run(rel, job, t0, c0)
    finally:
        ran = probe.stop() if probe is not None else None
    if probe is not None:
        res["coverage"] = probe.report(ran)
    return res


def _run(rel, job, t0, c0):
    left = failed_start.attempt(rel, job["layout"], job["params"], compose.close)  # engine setting tier_start_fail
    # engine setting tier_stop_fail
    left_stop = failed_start.attempt_stop(rel, job["layout"], job["params"], compose.close, runner_calls.shutdown)
    eng = rel.build(job["layout"], job["params"])
    for stat, found in (("failed_start_left", left), ("failed_stop_left", left_stop)):
        if found is not None:
            eng.stats[stat] = len(found)
            eng.violations.extend(found)
    res = {"ok": True}
    try:
        eng.run(job["requests"], job.get("max_steps", 200000))
        runner_calls.shutdown(eng)  # the engine core's teardown: what raises there is vLLM's too
    except Exception as e:  # noqa: BLE001 - an exception inside vLLM is a finding; in kvbound a fault
        res = {"ok": False, "error": "%s: %s" % (type(e).__name__, e),
               "assert_site": sidecar.assert_site(e),
               "traceback": sidecar.portable_traceback(e), "step": eng.step_no}
        if sidecar.raised_in_harness(e):
            res["harness_fault"] = True
    finally:
        compose.close(eng)
    counts = getattr(eng.csched.manager, "kvbound_counts", None)
    if counts:
        eng.stats.update(("tier_" + k, v) for k, v in counts.items())
    eng.stats.update(eng.transfers.faults.counts)  # fakes.TransferFaults: the faults that struck, if any
    res["lookups"] = eng.lookup_capture.lookups
    if getattr(eng, "store_calls", None) is not None:  # store_contract.py: judged by spec/store.py on the host
        res["store_calls"] = eng.store_calls
    res.update(stats=eng.stats, cases=eng.cases, violations=eng.violations,
               seconds=time.monotonic() - t0, cpu_seconds=time.process_time() - c0,
               step_cpu=[round(c - c0, 4) for c in eng.step_cpu])
    return refuse_unknown_kinds(res, eng.step_no)


def refuse_unknown_kinds(res, step):
    """A violation whose kind the findings table lacks is never reported as a finding: it is
    kvbound's own fault (a check that names a kind nobody declared), so the job reports a
    harness fault naming it, and the violations keep only the declared kinds."""
    declared, refused = [], set()
    for v in res.get("violations", ()):
        try:
            findings.row(v["check"])
            declared.append(v)
        except ValueError as e:
            refused.add(str(e))
    if refused:
        res["violations"] = declared
        if res.get("ok", True):
            res.update(ok=False, error="ValueError: " + "; ".join(sorted(refused)), assert_site=None,
                       traceback="", step=step, harness_fault=True)
    return res


def handle(rel, msg):
    try:
        return run_job(rel, msg["job"])
    except Exception as e:  # noqa: BLE001 - the engine could not be built
        return {"ok": False, "setup_error": "%s: %s" % (type(e).__name__, e),
                "assert_site": sidecar.assert_site(e),
                "traceback": sidecar.portable_traceback(e), "harness_fault": sidecar.raised_in_harness(e)}


def main():
    def release():
        probe = cover.probe_from_environment()
        if probe is not None:
            probe.start()  # before vLLM is imported: its modules' definitions are lines that run
        from .engine import Release

        rel = Release()
        if probe is not None:
            probe.stop(at_import=True)
        rel.coverage_probe = probe
        return rel

    return sidecar.serve(release, handle,
                         lambda rel: {"scheduler_file": sidecar.portable_path(rel.scheduler_file),
                                      "coverage": rel.coverage_probe is not None})
