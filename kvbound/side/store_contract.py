"""Shadow KV's store contract: what a store job may copy, and what the tier must hold.

Part of the side package (standard library only; vLLM's objects come in through ``eng``).
Each stored GPU block holds, in every slot its key covers, the KV of the key's prefix
(``check_store``, at the moment the store's content is copied); a store's source is not
rewritten before that copy (``guard_write``, the fence, at every write); after drain, every
chunk the policy offloads is in the tier (``check_lost_chunks``); and every
``_build_store_jobs`` call is recorded for the host's ``spec/store.py`` (``record_store_calls``,
with the shadow or without it).
"""

from .adapter import first_attr
from .capture import tokens_per_hash
from .content import block_table, describe


class StoreContract:
    """``content``: the GPU side (``content.ContentModel``); ``tier``: the transfers
    (``tier.TierTransfers``, set once both exist)."""

    def __init__(self, eng, content, report, bpc, tier=None):
        self.eng, self.content, self.report, self.bpc, self.tier = eng, content, report, bpc, tier

    def guard_write(self, bid, what, off=0):
        """A block that is the source of a store not yet copied (and not flushed) is not
        rewritten, in the slots the store's key covers: else another prefix's KV (or none) is
        stored under this prefix's key."""
        for jid in sorted(self.tier.source_jobs.get(bid, ())):
            job = self.tier.jobs.get(jid)
            if job is not None and not job.copied and off < job.keys.get(bid, 0):
                self.report.violate("store:source_rewritten", job.rid, None, bid, None,
                             "block %d, the source of store job %d (request %s) not yet copied, was"
                             " rewritten (%s) before the store completed or was flushed"
                             % (bid, jid, job.rid, what or "by the forward"), job=jid)

    def coverage(self, job):
        """GPU block -> how many of its leading slots the store's keys cover."""
        req = self.request(job.rid)
        where = self.key_positions(req) if req is not None else {}
        out = {}
        for g, bid, cb, sub in job.pairs:
            loc = where.get(job.cpu_keys.get(cb))
            B = self.content.block_size[g]
            if loc is None:
                out[bid] = B
                continue
            end = loc[1]
            tpc = B * self.bpc
            blk_start = ((end - 1) // tpc) * tpc + sub * B
            out[bid] = max(out.get(bid, 0), min(B, max(0, end - blk_start)))
        return out

    def check_store(self, job):
        """Each stored GPU block holds, in every slot its key covers, the KV of the key's
        prefix: the request's own computed content (no unwritten slot, no foreign content);
        the key names the chunk of that block in that group."""
        req = self.request(job.rid)
        if req is None:
            return
        where = self.key_positions(req)
        for g, bid, cb, sub in job.pairs:
            key = job.cpu_keys.get(cb)
            loc = where.get(key)
            if loc is None or loc[0] != g:
                self.report.violate("store:wrong_key", job.rid, g, bid, None,
                             "store job %d (request %s) copies group %d block %d into CPU block %d whose"
                             " key is %s, no chunk of this request in this group"
                             % (job.job_id, job.rid, g, bid, cb, "unknown" if loc is None else
                                "group %d's" % loc[0]), job=job.job_id)
                continue
            _, end = loc
            B = self.content.block_size[g]
            tpc = B * self.bpc
            chunk_start = ((end - 1) // tpc) * tpc
            blk_start = chunk_start + sub * B
            if blk_start >= end:
                continue
            if self.content.kinds[g] == "mamba":
                positions = [end - 1] if blk_start <= end - 1 < blk_start + B else []
            else:
                positions = range(blk_start, min(end, blk_start + B))
            content = self.content.slots(bid, g)
            for p in positions:
                want = self.content.ident(req, p)
                got = content[p - blk_start] if content is not None else None
                if got is None:
                    self.report.violate("store:unwritten_source", job.rid, g, bid, p,
                                 "store job %d (request %s) stores group %d block %d under the key of"
                                 " tokens [0, %d): position %d was never computed (unwritten)"
                                 % (job.job_id, job.rid, g, bid, end, p), job=job.job_id,
                                 expected=want, found=None, table=lambda: block_table(self.content, req, g, p))
                    break
                if got[0] != g or got[1] != want:
                    self.report.violate("store:foreign_source", job.rid, g, bid, p,
                                 "store job %d (request %s) stores group %d block %d under the key of"
                                 " tokens [0, %d): position %d holds %s, not this prefix's KV"
                                 % (job.job_id, job.rid, g, bid, end, p, describe(got)),
                                 job=job.job_id, expected=want, found=list(got), table=lambda: block_table(self.content, req, g, p))
                    break

    def request(self, rid):
        if rid is None:
            return None
        req = self.eng.sched.requests.get(rid)
        if req is None:
            st = getattr(self.eng.csched, "_req_status", {}).get(rid)
            req = getattr(st, "req", None) or self.content.seen_requests.get(rid)
        if req is not None:
            self.content.seen_requests[rid] = req
        return req

    def key_positions(self, req):
        """offload key -> (group, end): the key is the hash of the request's first ``end``
        tokens for that group (a whole chunk's key, or a partial tail's boundary key)."""
        ob = self.eng.rel.obase
        hashes = list(req.block_hashes)
        tph = tokens_per_hash(self.eng.csched.config)
        out = {}
        for pos, gc in enumerate(self.eng.csched.config.kv_group_configs):
            gi = getattr(gc, "group_idx", pos)
            for i, h in enumerate(hashes):
                out.setdefault(ob.make_offload_key(h, gi), (gi, (i + 1) * tph))
        return out

    def check_lost_chunks(self):
        """Every whole chunk of a finished (not aborted) request's full-attention, non-draft
        groups whose KV was computed (the final sampled token never is) and that the policy
        offloads (the prompt only, under ``offload_prompt_only``; no further than the request's
        ``max_offload_tokens``) is in the tier, unless the
        tier evicted it, refused to allocate, declined to store it (``TierTransfers.declined``),
        lost it to a connector reset and was not given it again (``reset_dropped``), or
        (scripted) stalled its write
        (``store:lost_chunk``, efficiency)."""
        eng = self.eng
        mgr = eng.csched.manager
        policy = getattr(mgr, "_policy", None)
        cfg = eng.csched.config
        if policy is None or any(g["kind"] != "full_attention" for g in eng.lay["groups"]):
            return  # hybrids: the release's store policy skips chunks no hit can reach
        # A release without the option (0.21 - 0.22: no file names it) has no prompt clamp: it
        # offloads decoded tokens too (0.21.0 offloading/scheduler.py:633, 0.22.1 :685
        # `num_offloadable_tokens = min(num_tokens_after_batch, req.num_tokens)`; the clamp
        # arrived with the option, 0.23.0 :745-748).
        prompt_only = getattr(cfg, "offload_prompt_only", False)
        # Not the connector's loss: what the tier evicted (its own LRU or the script), and
        # what the connector stored but a scripted tier never made readable (a stalled
        # write: complete_store withheld on purpose, fakes._script_stalled_writes).
        gone = self.tier.evicted | set(getattr(mgr, "kvbound_evicted", ())) | set(getattr(mgr, "kvbound_stalled", ()))
        ob = eng.rel.obase
        for rid in sorted(self.tier.finished, key=int):
            req = self.content.seen_requests.get(rid)
            if req is None:
                continue
            horizon = req.num_prompt_tokens if prompt_only else req.num_tokens - 1
            horizon = min(horizon, self.tier.finished[rid])
            # the request's own offload limit: kv_transfer_params max_offload_tokens, a
            # non-negative int (0.23.0 offloading/scheduler.py:197-207,737-739; 0.33.0 :399-410,762-768)
            cap = (getattr(req, "kv_transfer_params", None) or {}).get("max_offload_tokens")
            if type(cap) is int and cap >= 0:
                horizon = min(horizon, cap)
            hashes = list(req.block_hashes)
            for pos, gc in enumerate(cfg.kv_group_configs):
                gi = getattr(gc, "group_idx", pos)
                if self.content.kinds[gi] != "full_attention" or eng.lay["groups"][gi].get("eagle") \
                        or getattr(gc, "requires_cow_source", False):
                    continue
                hpc = first_attr(gc, "hashes_per_chunk", "hash_block_size_factor")
                tpc = self.content.block_size[gi] * self.bpc
                for j in range(horizon // tpc):
                    if (j + 1) * hpc > len(hashes):
                        break
                    key = ob.make_offload_key(hashes[(j + 1) * hpc - 1], gi)
                    if key in gone or key in self.tier.refused or key in self.tier.declined \
                            or key in self.tier.reset_dropped:
                        continue
                    blk = policy.get(key)
                    if blk is None or not blk.is_ready:
                        self.report.violate("store:lost_chunk", rid, gi, None, (j + 1) * tpc - 1,
                                     "request %s finished with group %d chunk %d (tokens [%d, %d))"
                                     " computed and offloadable, but the tier does not hold it"
                                     % (rid, gi, j, j * tpc, (j + 1) * tpc))
                        break


def record_store_calls(eng, tap):
    """Every ``_build_store_jobs`` call, per request: [status, num_prompt_tokens, num_tokens,
    num_computed_tokens, num_scheduled_tokens, max_offload_tokens, group 0's allocated chunks,
    keyed chunks (``len(offload_keys)``, what 0.30+'s ``storable_chunks`` caps at),
    next_stored_chunk_idx before, after, refused, {placeholders, drafts, lookahead, groups,
    eagle_speculation}] (judged by spec/store.py on the host). ``groups``: every offloaded group's
    [group index, kind, tagged ``is_eagle_group`` by vLLM's planner, the connector's
    ``GroupOffloadConfig.is_eagle_group``, allocated chunks, keyed chunks, next_stored_chunk_idx
    before, after, whether it is a copy-on-write source group (``requires_cow_source``), the chunks
    offered ``prepare_store``, those of them whose GPU block is null, the null chunks between the
    frontier before and after]; ``eagle_speculation``: what the connector reads to make every untagged group a
    drafter's (``use_eagle_block_drop()``, before 0.30 ``use_eagle()``). The rest, what the store
    premises read: the request's ``num_output_placeholders``, the draft tokens scheduled for it
    this step (``scheduled_spec_decode_tokens``) and the scheduler's ``num_lookahead_tokens``
    (proofs/store_premises.py). The planted defects ``drafter_skips_trailing`` and
    ``window_frontier_ahead`` act on the frontier vLLM just advanced (tests only).

    The one record of the store calls, the shadow KV's or not: it reads only vLLM's objects and
    the layout (each group's kind, the blocks per chunk), and sees the tier's ``prepare_store``
    answers itself (the chunks offered, the refusals), so it runs where the shadow does not (async
    scheduling with speculative decoding, engine.py). Subscribed after a scripted tier (which may
    refuse) and before the shadow's tier (whose planted ``drop_store`` and ``advance_on_refusal``
    act outside it)."""
    cs = eng.csched
    if not hasattr(cs, "_build_store_jobs"):
        return
    # Before 0.26 the field is next_stored_block_idx (0.25.1 offloading/scheduler.py:229),
    # whose store horizon spec/store.py does not model: no store-call record there.
    if "next_stored_chunk_idx" not in getattr(getattr(eng.rel.osched, "RequestGroupState", None),
                                              "__dataclass_fields__", {}):
        return
    eng.store_calls = []
    offered, refused_by = {}, {}  # request id -> the keys offered prepare_store this call; its refusals
    kinds = [g["kind"] for g in eng.lay["groups"]]
    bpc = eng.lay.get("blocks_per_chunk", 1)
    RS = eng.rel.RequestStatus
    lookahead = getattr(eng.sched, "num_lookahead_tokens", 0)
    sc = getattr(eng.vllm_config, "speculative_config", None)
    probe = getattr(sc, "use_eagle_block_drop", None) or getattr(sc, "use_eagle", None)
    eagle_speculation = bool(probe()) if sc is not None and probe is not None else False
    vgroups = eng.kv_cache_config.kv_cache_groups
    gcfgs = [(getattr(gc, "group_idx", pos), gc) for pos, gc in enumerate(cs.config.kv_group_configs)]

    def groups_of(st):
        return [[gi, kinds[gi], bool(getattr(vgroups[gi], "is_eagle_group", False)),
                 bool(getattr(gc, "is_eagle_group", False)), len(gs.block_ids) // bpc,
                 len(gs.offload_keys), gs.next_stored_chunk_idx]
                for (gi, gc), gs in zip(gcfgs, st.group_states)]

    def null(gs, c):  # the chunk's last GPU block, the one the connector stores from, is null
        i = c * bpc + bpc - 1
        return i < len(gs.block_ids) and gs.block_ids[i] == 0

    def offers(st, groups, keys):
        """After each group's frontier: whether it is a copy-on-write source group, the chunks the
        connector offered prepare_store, those of them whose block is null, and the null chunks
        between the frontier before and after."""
        where = {key: c for gs in st.group_states for c, key in enumerate(gs.offload_keys)}
        for (gi, gc), g, gs in zip(gcfgs, groups, st.group_states):
            mine = set(gs.offload_keys)
            offered = sorted({where[key] for key in keys if key in mine})
            g += [bool(getattr(gc, "requires_cow_source", False)), offered,
                  [c for c in offered if null(gs, c)], [c for c in range(g[6], g[7]) if null(gs, c)]]

    def plant(st, status, groups):
        """The planted frontier defects: a finished request's drafter group stops one chunk short
        of the chunks vLLM advanced over (0.29's hold-back at finish); a running request's
        sliding-window group one chunk past them."""
        for (gi, kind, _, draft, alloc, keyed, before), gs in zip(groups, st.group_states):
            if gs.next_stored_chunk_idx <= before:
                continue
            if eng.mutant == "drafter_skips_trailing" and draft and status != "running":
                gs.next_stored_chunk_idx -= 1
            elif eng.mutant == "window_frontier_ahead" and kind == "sliding_window" and status == "running":
                gs.next_stored_chunk_idx += 1

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
                           len(gs.block_ids) // bpc, len(gs.offload_keys), gs.next_stored_chunk_idx,
                           {"placeholders": getattr(req, "num_output_placeholders", 0),
                            "drafts": len((getattr(so, "scheduled_spec_decode_tokens", None) or {}).get(rid, ())),
                            "lookahead": lookahead, "groups": groups_of(st),
                            "eagle_speculation": eagle_speculation}]
        refused0 = dict(refused_by)
        offered.clear()
        out = call(so, *a, **k)
        for rid, rec in before.items():
            st = getattr(cs, "_req_status", {}).get(rid)
            if st is None:
                continue
            x = rec[-1]
            if eng.mutant in ("drafter_skips_trailing", "window_frontier_ahead"):
                plant(st, rec[0], x["groups"])
            for g, gs in zip(x["groups"], st.group_states):
                g.append(gs.next_stored_chunk_idx)
            offers(st, x["groups"], offered.get(rid, ()))
            eng.store_calls.append([eng.step_no, rid] + rec[:-1] + [
                st.group_states[0].next_stored_chunk_idx, refused_by.get(rid, 0) != refused0.get(rid, 0),
                x])
        return out

    def prepare_store(call, keys, *a, **k):
        keys = list(keys)
        rid = getattr(a[0] if a else k.get("req_context"), "req_id", None)
        offered.setdefault(rid, []).extend(keys)
        out = call(keys, *a, **k)
        if out is None:
            refused_by[rid] = refused_by.get(rid, 0) + 1
        return out

    tap.around(cs.manager, "prepare_store", prepare_store)
    tap.around(cs, "_build_store_jobs", _build_store_jobs)
