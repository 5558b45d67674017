"""The lifecycle checks ``kvbound trace`` makes inside the worker, on the real engine.

Each check is a promise of the connector or the allocator, checked where vLLM keeps it
(docs/trace.md lists each with the lines it is read from); a broken one is a violation
``{"check", "step", "request", "message"}`` handed to ``Engine.violate``:

- ``load_key_not_confirmed``: every key passed to the tier's ``prepare_load`` was answered
  HIT by this request's lookup and not evicted since;
- ``load_into_null_block`` / ``load_into_foreign_block``: a load writes only the
  request's own non-null blocks;
- ``allocation_exceeds_reservation``: ``allocate_slots`` takes no more blocks from the
  pool than ``get_num_blocks_to_allocate`` reserved for it;
- after drain (``check_drained``): every block free, no connector state left, no
  transfer pending, no chunk of the offload tier pinned by a read (``ref_cnt`` > 0: a load or,
  under the tiering spec, a cascade to a secondary tier, that nothing will complete; 0.33.0
  ``v1/kv_offload/cpu/manager.py:221-258``; a write still pending, ``ref_cnt`` -1, is the
  store checks' to judge).

Standard library only (vLLM's objects come in through ``eng``).
"""

from . import kv_events


class LifecycleChecks:
    def __init__(self, eng):
        self.eng = eng
        self.confirmed = {}  # request id -> keys the tier answered HIT (and not evicted since)
        self.evictions_seen = 0

    # -- tier: keys loaded were confirmed -------------------------------------------------
    def subscribe(self, tap):
        eng, checks = self.eng, self
        cs = eng.csched
        mgr = cs.manager
        lr = getattr(eng.rel.obase, "LookupResult", None)
        hit = lr.HIT if lr is not None else True  # before 0.25 lookup answers True (0.24.0 base.py:162)

        def _rid(a, k):
            ctx = a[0] if a else k.get("req_context")
            return getattr(ctx, "req_id", None)

        def sync_evictions():  # the scripted tier's evictions (read at every tier call)
            ev = getattr(mgr, "kvbound_evicted", ())
            checks.forget(ev[checks.evictions_seen:])
            checks.evictions_seen = len(ev)

        def lookup(call, key, *a, **k):
            sync_evictions()
            r = call(key, *a, **k)
            if r == hit:
                checks.confirmed.setdefault(_rid(a, k), set()).add(key)
            return r

        def prepare_load(call, keys, *a, **k):
            keys = list(keys)
            sync_evictions()
            eng.loaded_keys.append(keys)
            rid = _rid(a, k)
            unconfirmed = [x for x in keys if x not in checks.confirmed.get(rid, ())]
            if unconfirmed:
                eng.violate("lifecycle:load_key_not_confirmed", rid, "%d of %d keys passed to prepare_load were"
                            " not answered HIT by this request's lookup, or were evicted since"
                            % (len(unconfirmed), len(keys)))
            return call(keys, *a, **k)

        tap.around(mgr, "prepare_load", prepare_load)
        tap.around(mgr, "lookup", lookup)
        policy = getattr(mgr, "_policy", None)  # vLLM's CPU tier: its own LRU evictions too
        if policy is not None and hasattr(policy, "evict"):
            def evict(call, *a, **k):
                out = call(*a, **k)
                checks.forget([key for key, _ in out or ()])
                return out
            tap.around(policy, "evict", evict)
        self._subscribe_reservation(tap)
        tap.subscribe("update_states", self.check_block_copies)

    def forget(self, keys):
        """Evicted keys are no longer confirmed for any request: a later prepare_load of
        one without a new HIT is a load of an evicted key."""
        if keys:
            gone = set(keys)
            for s in self.confirmed.values():
                s -= gone

    # -- allocator: allocation within reservation ------------------------------------------
    def _subscribe_reservation(self, tap):
        """Every allocation takes no more blocks from the pool than the admission check
        reserved (get_num_blocks_to_allocate): else a request admitted with exactly that
        many free blocks crashes get_new_blocks. What the allocation takes to admit the request:
        up to its ``cache_blocks``, which caches what it computed once admitted, and where
        HiSparse's resident pages adopt spare copies of host pages after the admission (0.31.0
        single_type_kv_cache_manager.py:2554-2564 -> v1/hisparse/coordinator.py:401-417, 200-202,
        244-266: a ``touch`` of a free, evictable block, which cannot fail; from 0.32.0 in the
        connector's ``build_connector_meta``)."""
        eng = self.eng
        kvm = eng.sched.kv_cache_manager
        coord = kvm.coordinator
        counted, admitted = [], []  # the reservations of this allocation; the free blocks at its cache_blocks

        def get_num_blocks_to_allocate(call, *a, **k):
            n = call(*a, **k)
            if not k.get("apply_admission_cap"):
                counted.append(n)
            return n

        def cache_blocks(call, *a, **k):
            if not admitted:
                admitted.append(kvm.block_pool.get_num_free_blocks())
            return call(*a, **k)

        def allocate_slots(call, request, *a, **k):
            del counted[:], admitted[:]
            free = kvm.block_pool.get_num_free_blocks()
            out = call(request, *a, **k)
            taken = free - (admitted[0] if admitted else kvm.block_pool.get_num_free_blocks())
            if out is not None and counted and taken > counted[-1]:
                eng.violate("lifecycle:allocation_exceeds_reservation", request.request_id,
                            "allocate_slots took %d blocks from the pool, get_num_blocks_to_allocate"
                            " reserved %d (num_external_computed_tokens=%s, num_new_tokens=%s)"
                            % (taken, counted[-1], k.get("num_external_computed_tokens"),
                               a[0] if a else k.get("num_new_tokens")))
            return out

        tap.around(kvm, "allocate_slots", allocate_slots)
        tap.around(coord, "get_num_blocks_to_allocate", get_num_blocks_to_allocate)
        tap.around(coord, "cache_blocks", cache_blocks)

    # -- loads land in the request's own blocks ---------------------------------------------
    def owned_block_ids(self, request_id):
        mgr = self.eng.sched.kv_cache_manager
        out = set()
        for m in mgr.coordinator.single_type_managers:
            for b in m.req_to_blocks.get(request_id, ()):
                if not b.is_null:
                    out.add(b.block_id)
        return out

    def check_load_dst(self, request, ids):
        owned = self.owned_block_ids(request.request_id)
        for bid in ids:
            if bid == 0:
                self.eng.violate("lifecycle:load_into_null_block", request.request_id, "load destination block 0 (null)")
            elif bid not in owned:
                self.eng.violate("lifecycle:load_into_foreign_block", request.request_id,
                                 "load destination block %d is not one of the request's blocks" % bid)

    # -- a load stays within what the groups the connector does not fill hold ----------------
    def check_load_bound(self, request, blocks, num_computed_tokens, num_external_tokens):
        """``data:load_past_unfilled_group``: a load makes the request's first ``num_computed_tokens +
        num_external_tokens`` tokens computed in every group, and the connector fills only the groups
        it offloads; a full-attention group it does not offload holds those tokens only through
        prefix-cache hits, so each of its blocks under them is a cached block (``block_hash`` set).
        The promise: 0.33.0 offloading_connector.py:164-181 ``_max_loadable_tokens`` ("bounded by the
        deepest prefix the groups this connector does not offload already hold, since nothing refills
        them beyond it"; the groups, ``_bounding_group_ids`` :54-66). Windowed groups are not checked
        (their out-of-window blocks are null by design). A sync load's blocks are cached before the call
        (0.33.0 kv_cache_manager.py:613-625), so there a hashed block may not be computed yet: the check
        can miss a sync load past the group, never flag one within it."""
        eng = self.eng
        offloaded = {getattr(g, "group_idx", i) for i, g in enumerate(eng.csched.config.kv_group_configs)}
        end = num_computed_tokens + num_external_tokens
        for gi, group in enumerate(eng.kv_cache_config.kv_cache_groups):
            spec = group.kv_cache_spec
            if gi in offloaded or not getattr(spec, "prefix_cacheable", True) \
                    or "FullAttentionSpec" not in {c.__name__ for c in type(spec).__mro__}:
                continue
            size = spec.block_size
            table = blocks.blocks[gi]
            held = next((i for i, b in enumerate(table[:-(-end // size)]) if getattr(b, "block_hash", None) is None),
                        None)
            if held is not None or len(table) * size < end:
                held = min(held if held is not None else len(table), len(table))
                eng.violate("data:load_past_unfilled_group", request.request_id,
                            "a load of %d tokens after %d computed makes tokens [0, %d) computed, but group %d,"
                            " which the connector does not offload, holds only %d of them (its block %d is no"
                            " cache hit): nothing fills its KV for tokens [%d, %d)"
                            % (num_external_tokens, num_computed_tokens, end, gi, held * size, held,
                               held * size, end))

    # -- a block copy carries computed KV -----------------------------------------------
    def check_block_copies(self, so):
        """``data:copy_of_uncomputed_tokens`` for each of ``uncomputed_copies``, on vLLM's own
        output, with or without shadow KV."""
        copies = getattr(so, "kv_cache_block_copies", None) or ()
        if not copies:
            return
        self.eng.stats["block_copies"] = self.eng.stats.get("block_copies", 0) + len(copies)
        for r in uncomputed_copies(self.eng.sched, so):
            start, need = r["copied_tokens"]
            self.eng.violate(
                "data:copy_of_uncomputed_tokens", r["reader"],
                "block copy %d -> %d (request %s, group %d, tokens [%d, %d)) runs before this"
                " step's forward, but %s (%s)"
                % (r["src_block_id"], r["dst_block_id"], r["reader"], r["group"], start, need,
                   _empty_source(r),
                   ", ".join("request %s: %d computed, %d scheduled"
                             % (o, v["computed_before_step"], v["scheduled_this_step"])
                             for o, v in r["src_owners"].items())))

    # -- after drain ----------------------------------------------------------------------
    def check_drained(self):
        eng = self.eng
        bp = eng.sched.kv_cache_manager.block_pool
        free = bp.get_num_free_blocks()
        total = eng.kv_cache_config.num_blocks - 1  # the null block is never free
        if free != total:
            eng.violate("lifecycle:blocks_not_freed", None, "%d of %d blocks free after drain" % (free, total))
        cs = eng.csched
        for name in ("_req_status", "_requests", "_reqs_being_loaded", "_reqs_being_stored",
                     "_current_batch_load_jobs", "_jobs", "_load_jobs", "_store_jobs"):
            v = getattr(cs, name, None)
            if v:
                eng.violate("lifecycle:connector_state_left", None, "%s holds %d entries after drain" % (name, len(v)))
        tier = kv_events.cpu_tier(cs.manager)
        pinned = [key for key, c in kv_events.policy_chunks(tier._policy) if getattr(c, "ref_cnt", 0) > 0] \
            if tier is not None else []
        if pinned:
            eng.violate("lifecycle:tier_chunks_pinned", None, "%d chunks of the offload tier still pinned by a read"
                        " (ref_cnt > 0) after drain" % len(pinned))
        if eng.transfers.pending:
            eng.violate("lifecycle:transfer_not_finished", None, "%d jobs pending" % len(eng.transfers.pending))
        if getattr(eng, "pd_worker", None) is not None and eng.pd_worker.inflight:
            eng.violate("lifecycle:transfer_not_finished", None, "%d P/D loads in flight" % len(eng.pd_worker.inflight))
        eng.tap.publish("drained")  # the checks of what a run's end owes beside these (tier_lifecycle)


def _empty_source(r) -> str:
    """Why an ``uncomputed_copies`` record's source carries none of the copied tokens."""
    src = r["src_block_id"]
    if max(v["computed_before_step"] for v in r["src_owners"].values()) < r["copied_tokens"][1]:
        return "no holder of block %d had computed that far" % src
    if r["src_copied_this_step"]:
        return ("block %d is itself the destination of one of this step's copies, which run at once"
                " (every source is read before any destination is written)" % src)
    return "block %d is zeroed in this step, before the copies run" % src


def uncomputed_copies(sched, so):
    """The ``kv_cache_block_copies`` of ``so`` that carry tokens nobody has computed yet.

    The model runner zeroes the step's new blocks, applies the copies, then runs the forward
    (0.33.0 v1/worker/gpu_model_runner.py:1205-1211; 0.29.0 :1229-1238): a copy can carry only
    tokens computed before this step. The reader (the request whose table holds the
    destination) needs ``[i * block_size, its hit)`` of its block ``i``; some other holder of
    the source must have computed that far before the step, into the source itself. The
    step's copies run at once, every source gathered before any destination is written
    (0.33.0 v1/worker/utils.py:909-955, ``blocks[dst] = blocks[src]``): a source zeroed in
    this step, or itself a destination of one of the step's copies (a chain), holds none of
    its holders' tokens yet, whatever they had computed. One record per copy that breaks
    this: source and destination, reader, group, the tokens copied, each other holder of the
    source with what it had computed and what it is scheduled this step, and whether the
    source is zeroed, or a copy destination, in this very step. Also
    ``scripts/repro_cow_same_step.py``'s report."""
    copies = getattr(so, "kv_cache_block_copies", None) or ()
    if not copies:
        return []
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    scheduled = so.num_scheduled_tokens

    def before(rid):  # schedule() has already advanced num_computed_tokens by the step
        return sched.requests[rid].num_computed_tokens - scheduled.get(rid, 0)

    holders = {}
    for rid in sched.requests:
        for g, m in enumerate(mgrs):
            for i, b in enumerate(m.req_to_blocks.get(rid, ())):
                if not b.is_null:
                    holders.setdefault(b.block_id, []).append((rid, g, i))
    zeroed = set(getattr(so, "new_block_ids_to_zero", None) or ())
    dsts = {cp.dst_block_id for cp in copies}
    out = []
    for cp in copies:
        for rid, g, i in holders.get(cp.dst_block_id, ())[:1]:
            start = i * mgrs[g].block_size
            need = min(before(rid), start + mgrs[g].block_size)
            others = sorted({o for o, _, _ in holders.get(cp.src_block_id, ()) if o != rid})
            empty = cp.src_block_id in zeroed or cp.src_block_id in dsts  # holds nothing yet
            if others and need > start and (empty or max(before(o) for o in others) < need):
                out.append({"src_block_id": cp.src_block_id, "dst_block_id": cp.dst_block_id, "reader": rid,
                            "group": g, "copied_tokens": [start, need],
                            "src_owners": {o: {"computed_before_step": before(o),
                                               "scheduled_this_step": scheduled.get(o, 0)} for o in others},
                            "src_zeroed_this_step": cp.src_block_id in zeroed,
                            "src_copied_this_step": cp.src_block_id in dsts})
    return out
