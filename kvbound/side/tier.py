"""Shadow KV's tier: the connector's transfer jobs and the CPU tier's content.

Part of the side package (standard library only; vLLM's objects come in through the tap
and ``eng``). The CPU tier is a dict CPU block id -> ``blocks_per_chunk`` GPU-block
contents, written by store jobs and read by load jobs at a seeded moment between
submission and completion, following the job's specs the way vLLM's CPU worker maps them
(``kv_offload/cpu/gpu_worker.py`` ``transfer_async``); the fake transfer engine
(``fakes.py``) reports each job's submission, every step, each completion and each wait.
"""


class Job:
    __slots__ = ("kind", "job_id", "rid", "pairs", "copied", "done", "copy_in", "keys", "ok", "cpu_keys")

    def __init__(self, kind, job_id, rid, pairs, copy_in, keys, ok):
        self.kind, self.job_id, self.rid, self.pairs = kind, job_id, rid, pairs
        self.copied, self.done, self.copy_in, self.keys, self.ok = False, False, copy_in, keys, ok
        self.cpu_keys = {}  # a store's CPU block -> the key prepare_store allocated it for, at submission


def job_pairs(gpu_spec, cpu_ids, bpc):
    """(group, GPU block, CPU block, sub-block) of each GPU block of a job, as
    ``transfer_async`` maps them: per group, the GPU blocks in order onto the CPU
    sub-blocks from ``block_indices[g] % blocks_per_chunk`` on (0.29
    kv_offload/cpu/gpu_worker.py:577-605)."""
    out = []
    ids = [int(x) for x in gpu_spec.block_ids]
    sizes = list(gpu_spec.group_sizes) if gpu_spec.group_sizes is not None else [len(ids)]
    idxs = list(gpu_spec.block_indices) if getattr(gpu_spec, "block_indices", None) is not None \
        else [0] * len(sizes)
    go = co = 0
    for g, (n, bi) in enumerate(zip(sizes, idxs)):
        n = int(n)
        if n == 0:
            continue
        skip = int(bi) % bpc
        ncpu = -(-(n + skip) // bpc)
        for i in range(n):
            flat = skip + i
            out.append((g, ids[go + i], cpu_ids[co + flat // bpc], flat % bpc))
        go += n
        co += ncpu
    return out


class TierTransfers:
    """``content``: the GPU side (``content.ContentModel``); ``contract``: what a store's
    keys cover and the check at its copy (``store_contract.StoreContract``); ``rng`` seeds
    the moment each job copies."""

    def __init__(self, bpc, content, contract, report, rng, stats):
        self.bpc, self.content, self.contract, self.report, self.rng, self.stats = \
            bpc, content, contract, report, rng, stats
        self.cpu = {}  # CPU block id -> [content of each GPU sub-block]
        self.cpu_via = {}  # CPU block id -> which store job wrote it
        self.cpu_key = {}  # CPU block id -> the key prepare_store allocated it for
        self.jobs = {}  # job id -> Job (not yet completed)
        self.source_jobs = {}  # GPU block id -> ids of store jobs reading it, not yet done
        self.store_req = {}  # store job id -> request id (from the connector's metadata)
        self.store_cpu_keys = {}  # store job id -> {CPU block: its key} when the scheduler built the job
        self.load_meta = {}  # load job id -> request id
        self.finished = {}  # request id -> tokens computed when it finished (not aborted)
        self.refused = set()  # keys a prepare_store refused (the tier could not allocate)
        self.evicted = set()  # keys the tier evicted
        self.reset_dropped = set()  # keys a connector reset dropped from the tier, not stored again since
        self.declined = set()  # keys a prepare_store was offered but chose not to store, not holding them
        # (the CPU tier's store_threshold: a chunk offered fewer times is skipped, 0.33.0
        # v1/kv_offload/cpu/manager.py:281-291)
        stats.update(shadow_copies=0)

    def subscribe(self, tap, eng):
        """The connector's jobs, seen through the tap: which CPU block each store's key got,
        which request each job is for, which requests finished; and the planted defects
        that act there (tests only)."""
        sh, content = self, self.content
        cs = eng.csched
        mgr = cs.manager

        def prepare_store(call, keys, *a, **k):
            keys = list(keys)
            if eng.mutant == "drop_store" and len(keys) > 1:  # planted: a chunk never offered to the tier
                keys = keys[:-1]
            out = call(keys, *a, **k)
            if out is None:
                sh.refused.update(keys)
                if eng.mutant == "advance_on_refusal":  # planted: the connector takes a refusal for "stored"
                    return eng.rel.obase.PrepareStoreOutput(keys_to_store=[], store_spec=None, evicted_keys=[])
            else:
                sh.evicted.update(getattr(out, "evicted_keys", None) or ())
                policy = getattr(mgr, "_policy", None)
                taken = set(out.keys_to_store)
                sh.reset_dropped.difference_update(taken)
                sh.declined.update(key for key in keys if key not in taken
                                   and policy is not None and policy.get(key) is None)
                for key, cb in zip(out.keys_to_store, out.store_spec.block_ids):
                    sh.cpu_key[int(cb)] = key
            return out

        def build_connector_meta(call, so):
            meta = call(so)
            for jid, job in (getattr(meta, "store_jobs", None) or {}).items():
                sh.store_req[jid] = job.req_id
                # TransferJob(req_id, src_spec, dst_spec); before 0.25 TransferJob(req_id, transfer_spec)
                dst = job.dst_spec if hasattr(job, "dst_spec") else job.transfer_spec[1]
                ids = getattr(dst, "block_ids", None)
                if ids is not None:
                    sh.store_cpu_keys[jid] = {int(cb): sh.cpu_key.get(int(cb)) for cb in ids}
            for jid, job in (getattr(meta, "load_jobs", None) or {}).items():
                sh.load_meta[jid] = job.req_id
                if eng.mutant == "load_dst_shift":  # planted: a load lands one block off
                    job.dst_spec.block_ids = job.dst_spec.block_ids + 1
            if eng.mutant == "skip_fence" and getattr(meta, "jobs_to_flush", None):
                meta.jobs_to_flush = set()  # planted: block reuse no longer waits for its store
            return meta

        aborted = eng.rel.RequestStatus.FINISHED_ABORTED

        def request_finished(call, request, *a, **k):
            rid = request.request_id
            if request.status != aborted:
                sh.finished[rid] = min(request.num_computed_tokens, request.num_tokens - 1)
            else:
                sh.finished.pop(rid, None)
            content.seen_requests[rid] = request
            content.verified.pop(rid, None)
            return call(request, *a, **k)

        for tier in getattr(mgr, "secondary_tiers", None) or ():  # a tiering spec (0.33.0 tiering/manager.py)
            self._subscribe_secondary(tap, tier, eng.mutant)
        tap.around(mgr, "prepare_store", prepare_store)
        tap.around(cs, "build_connector_meta", build_connector_meta)
        tap.around(cs, "request_finished", request_finished)
        if eng.mutant == "store_past_horizon" and hasattr(cs, "_calc_num_offloadable_tokens"):
            tpb = content.block_size[0] * self.bpc

            def _calc_num_offloadable_tokens(call, req_status, num_computed_tokens):
                n = call(req_status, num_computed_tokens)
                return min(n + tpb, req_status.req.num_tokens)  # planted: one chunk past computed
            tap.around(cs, "_calc_num_offloadable_tokens", _calc_num_offloadable_tokens)

    def _subscribe_secondary(self, tap, tier, mutant=None):
        """A secondary tier's jobs (tiering/base.py ``TransferJob``: keys and primary chunk ids):
        a cascade copies each primary chunk's content into the tier under its key, a promotion
        copies a key's content back into a newly allocated primary chunk. The harness settles
        the tier's threads every step (``tier_clock.settle_tiers``), so each copies as it is
        submitted."""
        sh = self
        sh.mutant = mutant
        files = self.files = getattr(self, "files", {})  # key -> (content, how it arrived)

        def submit_store(call, job):
            for key, cid in zip(job.keys, job.chunk_ids):
                blk = sh.cpu.get(int(cid))
                files[key] = (None if blk is None else [None if c is None else list(c) for c in blk],
                              "the %s tier's copy of CPU block %d (%s)" % (tier.tier_type, int(cid),
                                                                       sh.cpu_via.get(int(cid), "no store")))
            return call(job)

        def submit_load(call, job):
            if sh.mutant == "promote_reversed_keys" and len(job.keys) > 1:  # planted: another key's file
                import dataclasses

                job = dataclasses.replace(job, keys=list(job.keys)[::-1])
            for key, cid in zip(job.keys, job.chunk_ids):
                blk, via = files.get(key, (None, "nothing the %s tier was given" % tier.tier_type))
                sh.cpu[int(cid)] = None if blk is None else [None if c is None else list(c) for c in blk]
                sh.cpu_via[int(cid)] = "promoted from " + via
                sh.cpu_key[int(cid)] = key
            return call(job)

        tap.around(tier, "submit_store", submit_store)
        tap.around(tier, "submit_load", submit_load)

    def submit(self, kind, job_id, src, dst, delay, ok):
        if kind == "store":
            pairs = job_pairs(src, [int(x) for x in dst.block_ids], self.bpc)
            rid = self.store_req.pop(job_id, None)
        else:
            pairs = job_pairs(dst, [int(x) for x in src.block_ids], self.bpc)
            rid = self.load_meta.pop(job_id, None)
        job = Job(kind, job_id, rid, pairs, self.rng.randint(0, delay), {}, ok)
        self.jobs[job_id] = job
        if kind == "store":
            # The key each CPU block was allocated for when the scheduler built the job: a
            # connector reset (reset_p) frees every chunk at once, those of stores built but not
            # yet submitted included (the worker defers a store to the next step), and the tier
            # allocates them again in the next step's schedule, before the worker submits and
            # waits for the flushed store (0.33.0 offloading/scheduler.py:2415-2450,
            # offloading/worker.py:219-244), so the flushed store still writes what it was built for.
            built = self.store_cpu_keys.pop(job_id, None) or {}
            job.cpu_keys = {cb: built[cb] if cb in built else self.cpu_key.get(cb) for _, _, cb, _ in pairs}
            # The CPU block holds what it held until this store writes it: a load flushed by a reset
            # still reads the old chunk after the tier gave the block to this store (the worker waits
            # for flushed loads before it submits new stores, 0.33.0 offloading/worker.py:219-244;
            # v1/kv_offload/cpu/manager.py:452-456); from here the block is this store's, unwritten.
            for cb in dict.fromkeys(cb for _, _, cb, _ in pairs):
                self.cpu.pop(cb, None)
                self.cpu_via.pop(cb, None)
            job.keys = self.contract.coverage(job)
            for g, bid, cb, sub in pairs:
                self.source_jobs.setdefault(bid, set()).add(job_id)
                if bid == 0:
                    self.report.violate("store:null_source", rid, g, 0, None,
                                 "store job %d (request %s) reads the null block for group %d"
                                 % (job_id, rid, g), job=job_id)
        if job.copy_in == 0:
            self.copy(job)

    def on_reset(self):
        """The connector reset the tier (``reset_prefix_cache(reset_connector=True)``): every
        chunk it held is gone (0.33.0 v1/kv_offload/cpu/manager.py:450-463)."""
        self.reset_dropped.update(self.cpu_key.values())

    def tick(self):
        """One engine step passes for every job in flight: those whose seeded moment came copy."""
        for jid in sorted(self.jobs):
            job = self.jobs[jid]
            if not job.copied:
                job.copy_in -= 1
                if job.copy_in <= 0:
                    self.copy(job)

    def complete(self, job_id):
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        if not job.copied:
            self.copy(job)
        for g, bid, cb, sub in job.pairs:
            s = self.source_jobs.get(bid)
            if s is not None:
                s.discard(job_id)
                if not s:
                    del self.source_jobs[bid]

    def flush(self, job_ids):
        """``wait``: the jobs' copies happen now."""
        for jid in sorted(job_ids):
            job = self.jobs.get(jid)
            if job is not None and not job.copied:
                self.copy(job)

    def copy(self, job):
        job.copied = True
        if not job.ok:
            return  # a failed job moves nothing
        self.stats["shadow_copies"] += 1
        if job.kind == "store":
            self.contract.check_store(job)
            for g, bid, cb, sub in job.pairs:
                blk = self.cpu.get(cb)
                if blk is None:
                    blk = self.cpu[cb] = [None] * self.bpc
                c = self.content.gpu.get(bid)
                blk[sub] = None if c is None else list(c)
                self.cpu_via[cb] = "store job %d of request %s from GPU block %d" % (job.job_id, job.rid, bid)
        else:
            for g, bid, cb, sub in job.pairs:
                blk = self.cpu.get(cb)
                c = blk[sub] if blk is not None else None
                self.content.write_block(bid, None if c is None else list(c),
                                 "load job %d (request %s) from CPU block %d, written by %s"
                                 % (job.job_id, job.rid, cb, self.cpu_via.get(cb, "no store")))
