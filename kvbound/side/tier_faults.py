"""Failed reads and writes of the file-system tier (engine settings ``tier_lose_p``, ``tier_torn_p``
and ``tier_store_fail_p``, layouts with the tiering spec; docs/trace.md "Faults").

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

A store job to the file tier meets a full disk (``tier_store_fail_p``, per job): at a block of the
job drawn from the seed, vLLM's own write of that block's temporary file raises ENOSPC in the tier's
I/O thread (``DiskFull``, in place of the ``os`` its I/O module writes through: 0.33.0
``fs/io.py:90-138`` ``_store_block``, ``os.write``, its clean-up ``:133-138``), vLLM removes the
temporary file and raises, and its pool reports the job failed (``fs/thread_pool.py:173-188``,
``fs/manager.py:280-322``). The job's other blocks land as the release writes them: from 0.27.0 one
task writes the job's blocks in order and stops at the first error (``fs/io.py:174-195``
``batch_store_block``), so the blocks before the drawn one; 0.24.0 - 0.26.0 run one task per block
(0.26.0 ``fs/manager.py:194-204``), so every other block. vLLM
then unpins the primary chunks the cascade read (``tiering/manager.py:543-549`` ->
``complete_read``; 0.24.0 ``:218-226``) and, from 0.33, counts the failure toward the detector's
pressure (``_update_backpressure`` :577-578, ``backpressure.py:368-384``); what it promises is
what the checks hold: nothing the tier lacks is looked up as held, and the engine drains with no
chunk pinned (``lifecycle:tier_chunks_pinned``).

Planted (tests only, the job's ``mutant``): ``failed_store_never_reported``, the tier drops the
result of a store job that failed (its primary chunks stay pinned); ``lost_read_reported_ok``, the tier reports a failed
promotion a success (its chunks made ready with nothing read into them); ``torn_file_kept``, the tier's read
leaves a short file in place instead of removing it; ``failed_promotion_never_reported``, the example tier
drops the result of a promotion that failed at a key it lost; ``promotion_never_reported``,
a secondary tier (any: the file tier, the example tier) never reports a promotion finished. Standard
library only; vLLM's objects come in through the tap.
"""

import contextlib
import errno
import os
import random
import sys

from . import tier_clock


def subscribe(eng, tap):
    """The fault on every file-system secondary tier of the engine's manager (nothing where the
    setting is off or no such tier runs)."""
    if eng.mutant == "promotion_never_reported":
        for tier in getattr(eng.csched.manager, "secondary_tiers", None) or ():
            _never_report_promotions(tier, tap)
    tiers = tier_clock.file_tiers(eng.csched.manager)
    p = eng.par.get("tier_store_fail_p")
    if p and tiers:
        rng = random.Random(repr(eng.par.get("seed", 0)) + "-tier-store-fail")
        eng.stats.update(tier_failed_stores=0)
        for tier in tiers:
            _fail_stores(eng, tap, tier, rng, p)
    counted = False  # the failed reads are counted by the first read fault on
    for how, setting in (("lost", "tier_lose_p"), ("torn", "tier_torn_p")):
        p = eng.par.get(setting)
        if p and tiers:
            rng = random.Random(repr(eng.par.get("seed", 0)) + "-tier-" + ("lose" if how == "lost" else how))
            eng.stats.update({"tier_%s_files" % how: 0, "tier_failed_reads": 0})
            for tier in tiers:
                _subscribe_tier(eng, tap, tier, rng, p, how, not counted)
            counted = True
    p = eng.par.get("tier_lose_p")
    examples = [t for t in getattr(eng.csched.manager, "secondary_tiers", None) or ()
                if type(t).__module__.endswith("tiering.example.manager")]
    if p and examples:
        rng = random.Random(repr(eng.par.get("seed", 0)) + "-tier-lose-example")
        eng.stats.update(tier_lost_keys=0, tier_failed_reads=0)
        for tier in examples:
            _forget_keys(eng, tap, tier, rng, p)


def _forget_keys(eng, tap, tier, rng, p):
    """``tier_lose_p`` on vLLM's example tier, which keeps a flag per key and moves no data (0.33.0
    tiering/example/manager.py:93,124-170; ``blocks`` to 0.29.0): with probability ``p`` per promotion
    job, the tier forgets one of its keys before its real ``submit_load`` reads them. What vLLM does
    with it is its own: the tier reports the job ``success=False`` (:165-170), and the tiering
    manager frees the job's primary chunks (``complete_write``, bound to ``complete_store``:
    0.22.1 tiering/manager.py:87,203-207 -> cpu/manager.py ``complete_store(success=False)``)."""
    held = "chunks" if hasattr(tier, "chunks") else "blocks"

    def submit_load(call, job):
        keys = [k for k in job.keys if k in getattr(tier, held)]
        if keys and rng.random() < p:
            getattr(tier, held).pop(keys[rng.randrange(len(keys))], None)
            eng.stats["tier_lost_keys"] += 1
        return call(job)

    def finished(call):
        results = call()
        eng.stats["tier_failed_reads"] += sum(1 for r in results if not r.success)
        if eng.mutant == "failed_promotion_never_reported":  # planted: the failed promotions' results dropped
            return [r for r in results if r.success]
        return results

    tap.around(tier, "submit_load", submit_load)
    tap.around(tier, tier_clock.finished_jobs_method(tier), finished)


class DiskFull:
    """The ``os`` module as vLLM's file-tier I/O module sees it: a write to a temporary file of one of
    ``paths`` (a block's file name) raises ENOSPC, once per open; a removal of one of ``kept`` does
    nothing (planted, ``torn_file_kept``); everything else is the real module's."""

    def __init__(self, module):
        self.module, self.real = module, getattr(module.os, "real", module.os)
        self.paths, self.fds, self.kept = set(), set(), set()

    def remove(self, path, *a, **k):
        if path in self.kept:
            return None
        return self.real.remove(path, *a, **k)

    def open(self, path, flags, *a, **k):
        fd = self.real.open(path, flags, *a, **k)
        # the I/O thread asks while the scheduler thread adds and discards paths: a membership
        # test of the block file a temporary file is for (``<file>_<n>.tmp``, fs/io.py:104), never
        # an iteration of the set
        if path.endswith(".tmp") and path.rsplit("_", 1)[0] in self.paths:
            self.fds.add(fd)
        return fd

    def write(self, fd, data):
        if fd in self.fds:
            self.fds.discard(fd)
            raise OSError(errno.ENOSPC, "No space left on device (kvbound's fault tier_store_fail_p)")
        return self.real.write(fd, data)

    def __getattr__(self, name):
        return getattr(self.real, name)


def restore(eng):
    """The file tier's I/O module's own ``os`` again (the worker process runs the next job)."""
    full = getattr(eng, "disk_full", None)
    if full is not None:
        full.module.os = full.real


def _fail_stores(eng, tap, tier, rng, p):
    """A store job to the file tier that meets a full disk: with probability ``p`` per job, vLLM's
    write of the job's block drawn from the seed fails with ENOSPC (``DiskFull``). The shadow KV is
    told, when the tier reports the job: a key whose file is not on disk is not in the tier."""
    full = _disk(eng, tier, "tier_store_fail_p fails the file tier's Python write path (fs/io.py _store_block)")
    at = random.Random(repr(eng.par.get("seed", 0)) + "-tier-store-fail-at")
    failing = {}  # job id -> its keys, until the tier reports the job
    failed = set()  # the jobs made to fail

    def submit_store(call, job):
        keys = list(job.keys)
        if keys and rng.random() < p:
            failing[job.job_id] = keys
            failed.add(job.job_id)
            full.paths.add(tier.file_mapper.get_file_name(keys[at.randrange(len(keys))]))
        return call(job)

    def finished(call):
        results = call()
        files = getattr(None if eng.shadow is None else eng.shadow.transfers, "files", {})
        for r in results:
            keys = failing.pop(r.job_id, None)
            if keys is None:
                continue
            eng.stats["tier_failed_stores"] += not r.success
            landed = set(tier_clock.on_disk(tier, keys))
            for key in keys:
                full.paths.discard(tier.file_mapper.get_file_name(key))
                if key not in landed:
                    files.pop(key, None)
        return results

    tap.around(tier, "submit_store", submit_store)
    tap.around(tier, tier_clock.finished_jobs_method(tier), finished)
    if eng.mutant == "failed_store_never_reported":  # planted: the tier drops a failed store's result
        def dropped(call):
            return [r for r in call() if r.success or r.job_id not in failed]

        tap.around(tier, tier_clock.finished_jobs_method(tier), dropped)


def _disk(eng, tier, what):
    """The engine's ``DiskFull`` in place of the ``os`` of the file tier's I/O module, once (put back by
    ``restore`` at the run's end); ``what`` says which fault needs the module's Python path."""
    full = getattr(eng, "disk_full", None)
    if full is None:
        full = eng.disk_full = DiskFull(_python_io(tier, what))
        full.module.os = full
    return full


def _python_io(tier, what):
    """The module of the file tier's block I/O (0.22.1 - 0.33.0 ``tiering/fs/io.py``, beside its
    manager's), where its Python path does the I/O; ``ValueError`` saying ``what`` needs that path
    where the tree's compiled ``fs_io_C`` extension does it instead."""
    module = sys.modules[type(tier).__module__.rsplit(".", 1)[0] + ".io"]
    if getattr(module, "_HAS_FSIO_C", False):
        raise ValueError(what + "; this tree's compiled fs_io_C extension does its I/O without it")
    return module


def _size(path):
    """The bytes of ``path``, or None where it is gone (the tier's I/O threads remove files meanwhile)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _subscribe_tier(eng, tap, tier, rng, p, how, count_reads):
    """A promotion's file ``how``: "lost" (removed) or "torn" (cut to half its bytes, as a torn write
    or a bad disk leaves it: the read comes up short, 0.33.0 fs/io.py:140-168, and vLLM removes the
    file, "a too-short file is genuine corruption"; 0.22.1 - 0.27.0 remove it on any read error, 0.22.1 fs/io.py:86-98).
    ``count_reads``: this subscription counts the failed reads (one of the read faults does)."""
    if how == "torn":
        _python_io(tier, "tier_torn_p tears a file the tier's Python read path reads and removes"
                         " (fs/io.py _load_block)")
    torn = {}  # job id -> the file it found torn, until the tier reports the job

    def submit_load(call, job):
        keys = list(job.keys)
        if not keys or rng.random() >= p:
            return call(job)
        # a lost file is any of the job's; a torn one its first, so the read comes to it (a batched read
        # stops at its first failure, 0.33.0 fs/io.py:213-226, and removes only what it read short)
        i = rng.randrange(len(keys)) if how == "lost" else 0
        path = tier.file_mapper.get_file_name(keys[i])
        whole = _size(path)
        if whole is not None:
            if how == "lost":
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            else:
                os.truncate(path, whole // 2)
                for other in [j for j, (p2, _) in torn.items() if p2 == path]:
                    del torn[other]  # a file stored again and torn again: the file is this job's now
                torn[job.job_id] = (path, whole)
                if eng.mutant == "torn_file_kept":  # planted: vLLM's removal of the short-read file skipped
                    _disk(eng, tier, "torn_file_kept keeps a file the tier's Python read path removes").kept.add(path)
            eng.stats["tier_%s_files" % how] += 1
        out = call(job)
        sh = None if eng.shadow is None else eng.shadow.transfers  # the shadow's tier (side/tier.py)
        if sh is not None:  # the read stops at the file: its chunk and the ones after hold nothing
            getattr(sh, "files", {}).pop(keys[i], None)  # lost, or removed by vLLM on the short read
            for cid in list(job.chunk_ids)[i:]:
                sh.cpu[int(cid)] = None
                sh.cpu_via[int(cid)] = "a promotion whose read failed at a %s file" % how
        return out

    def get_finished_jobs(call):  # the promotions vLLM's tier reports failed
        results = call()
        if count_reads:
            eng.stats["tier_failed_reads"] += sum(1 for r in results if not r.success)
        for r in results:  # a torn file is gone once its read is reported (0.33.0 fs/io.py:148-160): one
            # there now is short still, or a store wrote the key again since (whole)
            path, whole = torn.pop(r.job_id, (None, 0))
            size = None if path is None else _size(path)
            if size is not None and size < whole:
                eng.violations.append({
                    "check": "store:torn_file_kept", "step": eng.step_no, "file": os.path.basename(path),
                    "bytes": [size, whole],
                    "message": "the file-system tier reported promotion %s (success=%s) and kept the file it read"
                               " short, %s: its lookup goes on answering the key held, and every promotion of it"
                               " fails" % (r.job_id, r.success, os.path.basename(path))})
        return results

    tap.around(tier, "submit_load", submit_load)
    tap.around(tier, tier_clock.finished_jobs_method(tier), get_finished_jobs)
    if eng.mutant == "lost_read_reported_ok":  # planted: a failed promotion reported a success
        import dataclasses

        def reported_ok(call):
            return [dataclasses.replace(r, success=True, successful_keys=None)
                    if not r.success and getattr(r, "successful_keys", ...) is not ... else r for r in call()]

        tap.around(tier, tier_clock.finished_jobs_method(tier), reported_ok)


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
