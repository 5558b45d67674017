"""Shadow KV: what the real KV cache would hold, per block, and the checks on it.

Worker side (standard library only; vLLM's objects come in through ``eng``), imported by
``engine.py``. The content model (docs/trace.md, "Shadow KV"):

- the *prefix identity* of position ``p`` of a token sequence is a hash chain over its token
  ids ``0..p`` (request-independent: two requests with the same first ``p+1`` tokens have the
  same identity there, which is what makes prefix sharing legal);
- a GPU block is a list of ``tokens_per_block`` slots; a slot is ``None`` (unwritten, or
  zeroed by the model runner's ``new_block_ids_to_zero``) or ``(group, identity, request,
  position)``: the KV of that group's layers for that prefix, and who computed it;
- the forward writes, for every scheduled request and group, the slots of the positions the
  step computes (``num_computed_tokens .. + num_scheduled_tokens``, draft tokens included),
  into the block the request's block table names for that position; a Mamba group's state
  block keeps one state (the state after the last token the step computed, in the slot of
  that position);
- before the forward, every slot the model reads (attention: positions
  ``[get_num_skipped_tokens(c + extra_retained_tokens), c)``: a window's retained tokens are
  kept, never attended; Mamba: the state after ``c`` tokens) must hold the
  reading request's own identity at that position, else ``data:wrong_kv``;
- the CPU tier is a dict CPU block id -> ``blocks_per_chunk`` GPU-block contents, written by
  store jobs and read by load jobs at a seeded moment between submission and completion,
  following the job's specs the way vLLM's CPU worker maps them
  (``kv_offload/cpu/gpu_worker.py`` ``transfer_async``);
- the store contract is checked when a store's content is copied (``store:*``).
"""

import random

UNWRITTEN = "unwritten"


def chain(prev, tok):
    """The prefix identity after ``tok``, given the identity before it (ints hash the same
    in every process: no PYTHONHASHSEED dependence)."""
    return hash((prev, tok)) & 0xFFFFFFFFFFFF


class Job:
    __slots__ = ("kind", "job_id", "rid", "pairs", "copied", "done", "copy_in", "keys", "ok")

    def __init__(self, kind, job_id, rid, pairs, copy_in, keys, ok):
        self.kind, self.job_id, self.rid, self.pairs = kind, job_id, rid, pairs
        self.copied, self.done, self.copy_in, self.keys, self.ok = False, False, copy_in, keys, ok


class ShadowKV:
    def __init__(self, eng):
        self.eng = eng
        self.rng = random.Random(repr(eng.par.get("seed", 0)) + "/shadow")
        self.bpc = eng.lay.get("blocks_per_chunk", 1)
        kvm = eng.sched.kv_cache_manager
        self.managers = list(kvm.coordinator.single_type_managers)
        self.kinds = [g["kind"] for g in eng.lay["groups"]]
        self.block_size = [m.block_size for m in self.managers]
        self.gpu = {}  # GPU block id -> [slot] (None: unwritten)
        self.gpu_via = {}  # GPU block id -> how its content last arrived, when not computed in place
        self.cpu = {}  # CPU block id -> [content of each GPU sub-block]
        self.cpu_via = {}  # CPU block id -> which store job wrote it
        self.cpu_key = {}  # CPU block id -> the key prepare_store allocated it for
        self.chains = {}  # request id -> prefix identities of its real tokens so far
        self.jobs = {}  # job id -> Job (not yet completed)
        self.source_jobs = {}  # GPU block id -> ids of store jobs reading it, not yet done
        self.store_req = {}  # store job id -> request id (from the connector's metadata)
        self.load_meta = {}  # load job id -> request id
        self.lost = {}  # (request id, group, chunk) -> True for chunks to check after drain
        self.seen_requests = {}  # request id -> Request (kept for the after-drain check)
        self.reported = set()  # (check, request, group, block, position): once each
        self.finished = {}  # request id -> tokens computed when it finished (not aborted)
        self.refused = set()  # keys a prepare_store refused (the tier could not allocate)
        self.evicted = set()  # keys the tier evicted
        self.refused_by = {}  # request id -> prepare_store calls refused
        self.ver = {}  # GPU block id -> version, bumped when a slot someone verified changes
        self.checked_hi = {}  # GPU block id -> slots [0, hi) verified at this version (by anyone)
        self.verified = {}  # request -> {(group, block index) -> (block id, version, lo, hi) read clean
        self.stats = {"shadow_reads": 0, "shadow_writes": 0, "shadow_copies": 0}

    # -- prefix identities -----------------------------------------------------------------
    def token(self, req, p):
        """The real token at position ``p`` of ``req`` (prompt, or the fake model's sample)."""
        n = req.num_prompt_tokens
        if p < n:
            return req.prompt_token_ids[p]
        from .fakes import out_tok

        return out_tok(int(req.request_id), p - n)

    def ident(self, req, p):
        """Prefix identity of ``req``'s real tokens 0..p."""
        ch = self.chains.get(req.request_id)
        if ch is None:
            ch = self.chains[req.request_id] = []
            self.seen_requests[req.request_id] = req
        while len(ch) <= p:
            ch.append(chain(ch[-1] if ch else 0, self.token(req, len(ch))))
        return ch[p]

    # -- the model runner ------------------------------------------------------------------
    def update_states(self, so):
        """The model runner's ``_update_states`` (0.29 gpu_model_runner.py:1229-1238): zero
        the newly allocated blocks, then apply the scheduler's block copies."""
        for bid in getattr(so, "new_block_ids_to_zero", None) or ():
            self.write_block(int(bid), None, "zeroed")
        for cp in getattr(so, "kv_cache_block_copies", None) or ():
            src = self.gpu.get(cp.src_block_id)
            self.write_block(cp.dst_block_id, None if src is None else list(src),
                             "copied from block %d" % cp.src_block_id)

    def bump(self, bid):
        self.ver[bid] = self.ver.get(bid, 0) + 1
        self.checked_hi.pop(bid, None)

    def write_block(self, bid, content, via):
        self.guard_write(bid, via)
        self.bump(bid)
        if content is None:
            self.gpu.pop(bid, None)
        else:
            self.gpu[bid] = content
        if via is None:
            self.gpu_via.pop(bid, None)
        else:
            self.gpu_via[bid] = via

    def guard_write(self, bid, what, off=0):
        """A block that is the source of a store not yet copied (and not flushed) is not
        rewritten, in the slots the store's key covers: else another prefix's KV (or none) is
        stored under this prefix's key."""
        for jid in sorted(self.source_jobs.get(bid, ())):
            job = self.jobs.get(jid)
            if job is not None and not job.copied and off < job.keys.get(bid, 0):
                self.violate("store:source_rewritten", job.rid, None, bid, None,
                             "block %d, the source of store job %d (request %s) not yet copied, was"
                             " rewritten (%s) before the store completed or was flushed"
                             % (bid, jid, job.rid, what or "by the forward"), job=jid)

    def forward(self, so):
        """Read check, then the writes of one step's forward."""
        sched = self.eng.sched
        spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        for rid, n in so.num_scheduled_tokens.items():
            req = sched.requests.get(rid)
            if req is None or n <= 0:
                continue
            end = req.num_computed_tokens  # already advanced by schedule()
            start = end - n
            drafts = spec.get(rid, ())
            self.read_check(req, start)
            self.write(req, start, end, drafts)

    def slot_of(self, g, req, p):
        blocks = self.managers[g].req_to_blocks.get(req.request_id, ())
        i = p // self.block_size[g]
        if i >= len(blocks):
            return None, None
        b = blocks[i]
        return (0 if b.is_null else b.block_id), p % self.block_size[g]

    def read_check(self, req, c):
        """Every slot the step reads holds this request's own prefix. A block read clean at
        a version is not re-read until a slot someone verified changes (``bump``)."""
        if c <= 0:
            return
        rid = req.request_id
        verified = self.verified.setdefault(rid, {})
        for g, m in enumerate(self.managers):
            # the positions the step's first query attends: a sliding window also retains (never
            # attends) extra_retained_tokens behind it for an MTP re-prefill (0.33.0
            # v1/core/single_type_kv_cache_manager.py:1167-1184), so ask for the skip at c + extra
            lo = max(0, m.get_num_skipped_tokens(c + getattr(m, "extra_retained_tokens", 0)))
            B = self.block_size[g]
            blocks = m.req_to_blocks.get(rid, ())
            for i in range(lo // B, (c - 1) // B + 1):
                a, b = max(lo, i * B) - i * B, min(c, (i + 1) * B) - i * B
                bid = None if i >= len(blocks) else (0 if blocks[i].is_null else blocks[i].block_id)
                if bid:
                    hit = verified.get((g, i))
                    if hit is not None and hit[0] == bid and hit[1] == self.ver.get(bid, 0) \
                            and hit[2] <= a and b <= hit[3]:
                        continue
                bad = False
                for off in range(a, b):
                    p = i * B + off
                    self.stats["shadow_reads"] += 1
                    want = self.ident(req, p)
                    if not bid:
                        self.wrong_kv(req, g, bid, p, want, None, "no block" if bid is None else "the null block")
                        bad = True
                        break
                    content = self.gpu.get(bid)
                    got = content[off] if content is not None else None
                    if got is None or got[0] != g or got[1] != want:
                        self.wrong_kv(req, g, bid, p, want, got, self.gpu_via.get(bid))
                        bad = True
                        break
                if not bad:
                    verified[(g, i)] = (bid, self.ver.get(bid, 0), a, b)
                    if b > self.checked_hi.get(bid, 0):
                        self.checked_hi[bid] = b

    def wrong_kv(self, req, g, bid, p, want, got, via):
        self.violate("data:wrong_kv", req.request_id, g, bid, p,
                     "request %s reads group %d position %d from block %s: expected its own prefix"
                     " (identity %012x), found %s%s"
                     % (req.request_id, g, p, bid, want, describe(got),
                        "" if not via else " (content arrived: %s)" % via),
                     expected=want, found=None if got is None else list(got), provenance=via,
                     table=lambda: self.table(req, g, p))

    def write(self, req, start, end, drafts):
        nt = end - len(drafts)  # where the drafts start
        for g, kind in enumerate(self.kinds):
            if kind == "mamba":
                # the state after the step's last token; under spec decode also after each
                # verified position (the runner keeps one state per draft, so the accepted
                # one is there whichever it is)
                for p in range(max(start, end - 1 - len(drafts)), end):
                    bid, off = self.slot_of(g, req, p)
                    if bid:
                        content = self.gpu.get(bid)
                        if content is None or p == end - 1 - len(drafts):
                            self.guard_write(bid, "by the forward of request %s" % req.request_id)
                            content = [None] * self.block_size[g]
                            self.write_block(bid, content, None)
                        elif off < self.checked_hi.get(bid, 0):
                            self.bump(bid)
                        content[off] = (g, self.draft_ident(req, p, nt, drafts), req.request_id, p)
                        self.stats["shadow_writes"] += 1
                continue
            last = None
            for p in range(start, end):
                bid, off = self.slot_of(g, req, p)
                if not bid:
                    continue
                if bid != last:
                    self.guard_write(bid, "by the forward of request %s" % req.request_id, off)
                    last = bid
                content = self.gpu.get(bid)
                if content is None:
                    content = self.gpu[bid] = [None] * self.block_size[g]
                if off < self.checked_hi.get(bid, 0):
                    self.bump(bid)
                content[off] = (g, self.draft_ident(req, p, nt, drafts), req.request_id, p)
                self.stats["shadow_writes"] += 1

    def draft_ident(self, req, p, ds, drafts):
        """The identity the forward computes at ``p``: real tokens, then the scheduled draft
        tokens from position ``ds`` on (the last ``len(drafts)`` scheduled positions; async
        scheduling's placeholders included); a rejected draft's KV stays in its slot until
        overwritten."""
        if not drafts or p < ds:
            return self.ident(req, p)
        ident = self.ident(req, ds - 1)
        for d in drafts[:p - ds + 1]:
            ident = chain(ident, d)
        return ident

    # -- the connector's jobs (through the tap) -------------------------------------------------
    def subscribe(self, tap):
        eng, sh = self.eng, self
        cs = eng.csched
        mgr = cs.manager

        def prepare_store(call, keys, *a, **k):
            if eng.mutant == "drop_store" and len(keys) > 1:  # planted: a chunk never offered to the tier
                keys = list(keys)[:-1]
            out = call(keys, *a, **k)
            if out is None:
                sh.refused.update(keys)
                ctx = a[0] if a else k.get("req_context")
                rid = getattr(ctx, "req_id", None)
                sh.refused_by[rid] = sh.refused_by.get(rid, 0) + 1
            else:
                sh.evicted.update(getattr(out, "evicted_keys", None) or ())
                for key, cb in zip(out.keys_to_store, out.store_spec.block_ids):
                    sh.cpu_key[int(cb)] = key
                    sh.cpu.pop(int(cb), None)
                    sh.cpu_via.pop(int(cb), None)
            return out

        def build_connector_meta(call, so):
            meta = call(so)
            for jid, job in (getattr(meta, "store_jobs", None) or {}).items():
                sh.store_req[jid] = job.req_id
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
            sh.seen_requests[rid] = request
            sh.verified.pop(rid, None)
            return call(request, *a, **k)

        tap.around(mgr, "prepare_store", prepare_store)
        tap.around(cs, "build_connector_meta", build_connector_meta)
        tap.around(cs, "request_finished", request_finished)
        self._subscribe_store_capture(tap)
        if eng.mutant == "store_past_horizon" and hasattr(cs, "_calc_num_offloadable_tokens"):
            tpb = self.block_size[0] * self.bpc

            def _calc_num_offloadable_tokens(call, req_status, num_computed_tokens):
                n = call(req_status, num_computed_tokens)
                return min(n + tpb, req_status.req.num_tokens)  # planted: one chunk past computed
            tap.around(cs, "_calc_num_offloadable_tokens", _calc_num_offloadable_tokens)
        tap.subscribe("update_states", self.update_states)
        tap.subscribe("forward", self.forward)

    def _subscribe_store_capture(self, tap):
        """Every ``_build_store_jobs`` call, per request, for group 0 when it is full
        attention and not a drafter's: [status, num_prompt_tokens, num_tokens,
        num_computed_tokens, num_scheduled_tokens, max_offload_tokens, allocated chunks,
        next_stored_chunk_idx before, after, refused] (judged by spec/store.py on the host)."""
        eng, sh = self.eng, self
        cs = eng.csched
        if self.kinds[0] != "full_attention" or eng.lay["groups"][0].get("eagle") \
                or not hasattr(cs, "_build_store_jobs"):
            return
        # Before 0.26 the field is next_stored_block_idx (0.25.1 offloading/scheduler.py:229),
        # whose store horizon spec/store.py does not model: no store-call record there.
        if "next_stored_chunk_idx" not in getattr(getattr(eng.rel.osched, "RequestGroupState", None),
                                                  "__dataclass_fields__", {}):
            return
        eng.store_calls = []
        RS = eng.rel.RequestStatus

        def _build_store_jobs(call, so, *a, **k):
            before = {}
            for rid in list(so.num_scheduled_tokens) + list(so.finished_req_ids or ()):
                st = getattr(cs, "_req_status", {}).get(rid)
                if st is None or rid in before:
                    continue
                req = st.req
                status = "aborted" if req.status == RS.FINISHED_ABORTED else (
                    "finished" if req.is_finished() else "running")
                gs = (getattr(st, "group_states", None) or (None,))[0]
                if gs is None or not hasattr(gs, "next_stored_chunk_idx") or not hasattr(gs, "block_ids"):
                    continue  # before 0.26 the per-group store state is not this shape: not captured
                before[rid] = [status, req.num_prompt_tokens, req.num_tokens, req.num_computed_tokens,
                               so.num_scheduled_tokens.get(rid, 0), getattr(st, "max_offload_tokens", None),
                               len(gs.block_ids) // self.bpc, gs.next_stored_chunk_idx]
            refused0 = dict(sh.refused_by)
            out = call(so, *a, **k)
            for rid, rec in before.items():
                st = getattr(cs, "_req_status", {}).get(rid)
                if st is None:
                    continue
                eng.store_calls.append([eng.step_no, rid] + rec + [
                    st.group_states[0].next_stored_chunk_idx, sh.refused_by.get(rid, 0) != refused0.get(rid, 0)])
            return out

        tap.around(cs, "_build_store_jobs", _build_store_jobs)

    def pairs(self, gpu_spec, cpu_ids):
        """(group, GPU block, CPU block, sub-block) of each GPU block of a job, as
        ``transfer_async`` maps them: per group, the GPU blocks in order onto the CPU
        sub-blocks from ``block_indices[g] % blocks_per_chunk`` on (0.29
        kv_offload/cpu/gpu_worker.py:577-605)."""
        out = []
        bpc = self.bpc
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

    def submit(self, kind, job_id, src, dst, delay, ok):
        if kind == "store":
            pairs = self.pairs(src, [int(x) for x in dst.block_ids])
            rid = self.store_req.pop(job_id, None)
        else:
            pairs = self.pairs(dst, [int(x) for x in src.block_ids])
            rid = self.load_meta.pop(job_id, None)
        job = Job(kind, job_id, rid, pairs, self.rng.randint(0, delay), {}, ok)
        self.jobs[job_id] = job
        if kind == "store":
            job.keys = self.coverage(job)
            for g, bid, cb, sub in pairs:
                self.source_jobs.setdefault(bid, set()).add(job_id)
                if bid == 0:
                    self.violate("store:null_source", rid, g, 0, None,
                                 "store job %d (request %s) reads the null block for group %d"
                                 % (job_id, rid, g), job=job_id)
        if job.copy_in == 0:
            self.copy(job)

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
            self.check_store(job)
            for g, bid, cb, sub in job.pairs:
                blk = self.cpu.get(cb)
                if blk is None:
                    blk = self.cpu[cb] = [None] * self.bpc
                c = self.gpu.get(bid)
                blk[sub] = None if c is None else list(c)
                self.cpu_via[cb] = "store job %d of request %s from GPU block %d" % (job.job_id, job.rid, bid)
        else:
            for g, bid, cb, sub in job.pairs:
                blk = self.cpu.get(cb)
                c = blk[sub] if blk is not None else None
                self.write_block(bid, None if c is None else list(c),
                                 "load job %d (request %s) from CPU block %d, written by %s"
                                 % (job.job_id, job.rid, cb, self.cpu_via.get(cb, "no store")))

    def coverage(self, job):
        """GPU block -> how many of its leading slots the store's keys cover."""
        req = self.request(job.rid)
        where = self.key_positions(req) if req is not None else {}
        out = {}
        for g, bid, cb, sub in job.pairs:
            loc = where.get(self.cpu_key.get(cb))
            B = self.block_size[g]
            if loc is None:
                out[bid] = B
                continue
            end = loc[1]
            tpc = B * self.bpc
            blk_start = ((end - 1) // tpc) * tpc + sub * B
            out[bid] = max(out.get(bid, 0), min(B, max(0, end - blk_start)))
        return out

    # -- the store contract ---------------------------------------------------------------------
    def check_store(self, job):
        """Each stored GPU block holds, in every slot its key covers, the KV of the key's
        prefix: the request's own computed content (no unwritten slot, no foreign content);
        the key names the chunk of that block in that group."""
        eng = self.eng
        req = self.request(job.rid)
        if req is None:
            return
        where = self.key_positions(req)
        for g, bid, cb, sub in job.pairs:
            key = self.cpu_key.get(cb)
            loc = where.get(key)
            if loc is None or loc[0] != g:
                self.violate("store:wrong_key", job.rid, g, bid, None,
                             "store job %d (request %s) copies group %d block %d into CPU block %d whose"
                             " key is %s, no chunk of this request in this group"
                             % (job.job_id, job.rid, g, bid, cb, "unknown" if loc is None else
                                "group %d's" % loc[0]), job=job.job_id)
                continue
            _, end = loc
            B = self.block_size[g]
            tpc = B * self.bpc
            chunk_start = ((end - 1) // tpc) * tpc
            blk_start = chunk_start + sub * B
            if blk_start >= end:
                continue
            if self.kinds[g] == "mamba":
                positions = [end - 1] if blk_start <= end - 1 < blk_start + B else []
            else:
                positions = range(blk_start, min(end, blk_start + B))
            content = self.gpu.get(bid)
            for p in positions:
                want = self.ident(req, p)
                got = content[p - blk_start] if content is not None else None
                if got is None:
                    self.violate("store:unwritten_source", job.rid, g, bid, p,
                                 "store job %d (request %s) stores group %d block %d under the key of"
                                 " tokens [0, %d): position %d was never computed (unwritten)"
                                 % (job.job_id, job.rid, g, bid, end, p), job=job.job_id,
                                 expected=want, found=None, table=lambda: self.table(req, g, p))
                    break
                if got[0] != g or got[1] != want:
                    self.violate("store:foreign_source", job.rid, g, bid, p,
                                 "store job %d (request %s) stores group %d block %d under the key of"
                                 " tokens [0, %d): position %d holds %s, not this prefix's KV"
                                 % (job.job_id, job.rid, g, bid, end, p, describe(got)),
                                 job=job.job_id, expected=want, found=list(got), table=lambda: self.table(req, g, p))
                    break

    def request(self, rid):
        if rid is None:
            return None
        req = self.eng.sched.requests.get(rid)
        if req is None:
            st = getattr(self.eng.csched, "_req_status", {}).get(rid)
            req = getattr(st, "req", None) or self.seen_requests.get(rid)
        if req is not None:
            self.seen_requests[rid] = req
        return req

    def key_positions(self, req):
        """offload key -> (group, end): the key is the hash of the request's first ``end``
        tokens for that group (a whole chunk's key, or a partial tail's boundary key)."""
        ob = self.eng.rel.obase
        cap = self.eng.rel.capture
        hashes = list(req.block_hashes)
        tph = cap._tokens_per_hash(self.eng.csched.config)
        out = {}
        for pos, gc in enumerate(self.eng.csched.config.kv_group_configs):
            gi = getattr(gc, "group_idx", pos)
            for i, h in enumerate(hashes):
                out.setdefault(ob.make_offload_key(h, gi), (gi, (i + 1) * tph))
        return out

    # -- after drain: the chunks the policy offloads are in the tier ------------------------
    def check_lost_chunks(self):
        """Every whole chunk of a finished (not aborted) request's full-attention, non-draft
        groups whose KV was computed (the final sampled token never is) and that the policy
        offloads (the prompt only, under ``offload_prompt_only``) is in the tier, unless the
        tier evicted it, refused to allocate, or (scripted) stalled its write
        (``store:lost_chunk``, efficiency)."""
        eng = self.eng
        mgr = eng.csched.manager
        policy = getattr(mgr, "_policy", None)
        cfg = eng.csched.config
        if policy is None or any(g["kind"] != "full_attention" for g in eng.lay["groups"]):
            return  # hybrids: the release's store policy skips chunks no hit can reach
        prompt_only = getattr(cfg, "offload_prompt_only", True)
        # Not the connector's loss: what the tier evicted (its own LRU or the script), and
        # what the connector stored but a scripted tier never made readable (a stalled
        # write: complete_store withheld on purpose, fakes._script_stalled_writes).
        gone = self.evicted | set(getattr(mgr, "kvbound_evicted", ())) | set(getattr(mgr, "kvbound_stalled", ()))
        ob = eng.rel.obase
        for rid in sorted(self.finished, key=int):
            req = self.seen_requests.get(rid)
            if req is None:
                continue
            horizon = req.num_prompt_tokens if prompt_only else req.num_tokens - 1
            horizon = min(horizon, self.finished[rid])
            hashes = list(req.block_hashes)
            for pos, gc in enumerate(cfg.kv_group_configs):
                gi = getattr(gc, "group_idx", pos)
                if self.kinds[gi] != "full_attention" or eng.lay["groups"][gi].get("eagle") \
                        or getattr(gc, "requires_cow_source", False):
                    continue
                hpc = eng.rel.capture._first(gc, "hashes_per_chunk", "hash_block_size_factor")
                tpc = self.block_size[gi] * self.bpc
                for j in range(horizon // tpc):
                    if (j + 1) * hpc > len(hashes):
                        break
                    key = ob.make_offload_key(hashes[(j + 1) * hpc - 1], gi)
                    if key in gone or key in self.refused:
                        continue
                    blk = policy.get(key)
                    if blk is None or not blk.is_ready:
                        self.violate("store:lost_chunk", rid, gi, None, (j + 1) * tpc - 1,
                                     "request %s finished with group %d chunk %d (tokens [%d, %d))"
                                     " computed and offloadable, but the tier does not hold it"
                                     % (rid, gi, j, j * tpc, (j + 1) * tpc))
                        break

    def table(self, req, g, p):
        """The request's block table in group ``g`` up to position ``p``'s block (three blocks
        before it), each block's slots as runs: [what, first position, last + 1, writer, writer's
        first position] with what = own (this prefix's KV), foreign, unwritten."""
        B = self.block_size[g]
        blocks = self.managers[g].req_to_blocks.get(req.request_id, ())
        fi = p // B
        rows = []
        for i in range(max(0, fi - 3), min(len(blocks), fi + 1)):
            bid = 0 if blocks[i].is_null else blocks[i].block_id
            runs = []
            content = self.gpu.get(bid) if bid else None
            for off in range(B):
                q = i * B + off
                got = content[off] if content is not None else None
                if got is None:
                    key = ["unwritten", None, None]
                elif got[0] == g and got[1] == self.ident(req, q):
                    key = ["own", None, None]
                else:
                    key = ["foreign", got[2], got[3]]
                last = runs[-1] if runs else None
                if last and last[0] == key[0] and last[3] == key[1] and (
                        key[0] != "foreign" or last[4] + (last[2] - last[1]) == key[2]):
                    last[2] = q + 1
                else:
                    runs.append([key[0], q, q + 1, key[1], key[2]])
            rows.append({"index": i, "block_id": bid, "tokens": [i * B, (i + 1) * B], "runs": runs,
                         "via": self.gpu_via.get(bid)})
        return {"group": g, "request": req.request_id, "block_size": B, "position": p, "rows": rows}

    def violate(self, check, rid, g, bid, p, msg, **extra):
        # once per (check, request, group, block): a wrong block reads wrong at every position
        tag = (check, rid, g, bid) if check == "data:wrong_kv" else (check, rid, g, bid, p)
        if tag in self.reported:
            return
        self.reported.add(tag)
        if callable(extra.get("table")):
            extra["table"] = extra["table"]()
        self.eng.violations.append(dict({"check": check, "step": self.eng.step_no, "request": rid,
                                         "group": g, "block_id": bid, "position": p, "message": msg},
                                        **extra))


def describe(slot):
    if slot is None:
        return UNWRITTEN
    g, ident, rid, p = slot
    return "group %d KV of request %s position %d (identity %012x)" % (g, rid, p, ident)
