"""Failed reads of the file-system tier (engine setting ``tier_lose_p``, layouts with the tiering
spec; docs/trace.md "Faults").

A file a promotion is about to read is gone (a disk error, another host's cleanup of a shared
directory): with probability ``tier_lose_p`` per promotion job, one of its keys' files is removed
before the tier's real ``submit_load`` hands the read to its I/O thread. What vLLM does with it
is its own: the batched read stops at the missing file and the blocks before it are kept (0.33.0
``v1/kv_offload/tiering/fs/io.py:198-226``, ``fs/manager.py:239-274``), the tier marks the failed
keys a miss and reports ``success=False`` with the keys that loaded (``fs/manager.py:298-315``),
the tiering manager completes the kept keys' primary chunks and frees the failed ones
(``tiering/manager.py:460-499`` -> ``cpu/manager.py:384-400`` ``complete_store(success=False)``),
and a request waiting on them looks up again. What it promises is what every check already
holds: no lookup claims a chunk the tier does not hold ready, no request waits for ever, every
token reads its own prefix's KV. The shadow KV is told: a failed key's primary chunk holds
nothing, and the lost file is gone from the tier.

Planted (tests only, the job's ``mutant``): ``lost_read_reported_ok``, the tier reports a failed
promotion a success (its chunks made ready with nothing read into them); ``promotion_never_reported``,
a secondary tier (any: the file tier, the example tier) never reports a promotion finished. Standard
library only; vLLM's objects come in through the tap.
"""

import os
import random

from . import tier_clock


def subscribe(eng, tap):
    """The fault on every file-system secondary tier of the engine's manager (nothing where the
    setting is off or no such tier runs)."""
    if eng.mutant == "promotion_never_reported":
        for tier in getattr(eng.csched.manager, "secondary_tiers", None) or ():
            _never_report_promotions(tier, tap)
    p = eng.par.get("tier_lose_p")
    tiers = [t for t in getattr(eng.csched.manager, "secondary_tiers", None) or () if hasattr(t, "file_mapper")]
    if not p or not tiers:
        return
    rng = random.Random(repr(eng.par.get("seed", 0)) + "-tier-lose")
    eng.stats.update(tier_lost_files=0, tier_failed_reads=0)
    for tier in tiers:
        _subscribe_tier(eng, tap, tier, rng, p)


def _subscribe_tier(eng, tap, tier, rng, p):
    def submit_load(call, job):
        keys = list(job.keys)
        if not keys or rng.random() >= p:
            return call(job)
        i = rng.randrange(len(keys))
        path = tier.file_mapper.get_file_name(keys[i])
        if os.path.exists(path):
            os.unlink(path)
            eng.stats["tier_lost_files"] += 1
        out = call(job)
        sh = None if eng.shadow is None else eng.shadow.transfers  # the shadow's tier (side/tier.py)
        if sh is not None:  # the read stops at the lost file: its chunk and the ones after hold nothing
            getattr(sh, "files", {}).pop(keys[i], None)
            for cid in list(job.chunk_ids)[i:]:
                sh.cpu[int(cid)] = None
                sh.cpu_via[int(cid)] = "a promotion whose read failed at a lost file"
        return out

    def get_finished_jobs(call):  # the promotions vLLM's tier reports failed
        results = call()
        eng.stats["tier_failed_reads"] += sum(1 for r in results if not r.success)
        return results

    tap.around(tier, "submit_load", submit_load)
    tap.around(tier, "get_finished_jobs", get_finished_jobs)
    if eng.mutant == "lost_read_reported_ok":  # planted: a failed promotion reported a success
        import dataclasses

        def reported_ok(call):
            return [dataclasses.replace(r, success=True, successful_keys=None)
                    if not r.success and getattr(r, "successful_keys", ...) is not ... else r for r in call()]

        tap.around(tier, "get_finished_jobs", reported_ok)


def _never_report_promotions(tier, tap):
    """Planted: the tier drops the result of every promotion (``submit_load``) it finished, so the
    primary chunks it fills stay pending for ever."""
    loads = set()

    def submit_load(call, job):
        loads.add(job.job_id)
        return call(job)

    def finished(call):
        return [r for r in call() if r.job_id not in loads]

    tap.around(tier, "submit_load", submit_load)
    tap.around(tier, tier_clock.finished_jobs_method(tier), finished)
