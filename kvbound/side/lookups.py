"""Every real ``get_num_new_matched_tokens`` call, captured with the tier's answers at
that moment, and the request's progress (``liveness:stuck_request``).

Worker side (standard library and vLLM only; imported by ``engine.py`` as part of the
side package). Each captured lookup is a lookup case (docs/case-format.md, "Lookup
cases") plus what the real call returned; the host (``kvbound/trace/lookup_checks.py``)
checks the spec's equality and the lookup contract (docs/lookup.md) on it.

The tier's answers: every ``manager.lookup`` the call made, in order (a key asked
twice is answered twice), named ``G:C`` (group_idx, chunk) or ``G:b:T`` (a partial
tail's boundary key at T tokens, when it is no chunk's key); every other chunk key of
the request from the chunk of ``num_computed_tokens`` on is probed in the tier's own
table (``_policy.get``: absent MISS, not ready HIT_PENDING, else HIT), which changes
nothing in the tier.

An answer that is no ``LookupResult`` (0.25+; a test double's ``return_value = False``, say) is
outside the tier's interface (0.33.0 ``v1/kv_offload/base.py:305-315``): 0.25+'s ``match``
takes no branch for it, neither counting nor stopping (0.25.1 ``offloading/scheduler.py:398-409``,
0.33.0 :786-802), so the connector asks on where a MISS would stop it. The record keeps such
answers (``foreign_answers``) and the host judges no such call: a lookup case cannot express
them. 0.21-0.24 read the answer's truth (0.24.0 :397-403), which the True/None/False names keep.

Planted defects (tests only, ``params["mutant"]``): the ``lookup_*`` rows of
``defects.DEFECTS``, planted in ``mutate`` (the hit) and ``subscribe`` (the keys asked).
"""

from .adapter import first_attr, kind_of
from .capture import tokens_per_hash

# How many lookups in a row may defer a request (docs/lookup.md, progress): each step the scheduler
# asks the request again, so this many steps of waiting on the tier; a step whose scheduling pass
# does not reach the request (the batch full, the token budget spent) asks nothing and counts nothing.
# A late answer of the file tier's lookup thread (the fault tier_lookup_late_p) restarts the count of
# the requests asking its keys: each key a waiting request is asked for is probed once (0.29.0
# tiering/async_lookup.py:138-145), but keys join its scan as its local hit shrinks or a CPU-tier hit
# is evicted (0.29.0 offloading/scheduler.py:768-770), so rounds of late_steps can follow one another; after
# the last late answer the schedule is the unfaulted one the bound is set for.
STUCK_BOUND_LOOKUPS = 64


class LookupCapture:
    def __init__(self, eng):
        self.eng = eng
        self.cs = eng.csched
        self.asked = None  # [(key, answer)] while a real call runs
        self.extra_key = None  # lookup_extra_key: the key the planted defect asks first
        self.lookups = []
        self.deferred_since = {}  # request id -> [step of its first deferral in a row, deferrals in the row]
        self.stuck = set()
        self.to_abort = []
        self.never = set()  # lookup_never_return: requests deferred once
        lr = getattr(eng.rel.obase, "LookupResult", None)
        self.names = {}
        if lr is not None:
            self.names = {lr.HIT: "HIT", lr.HIT_PENDING: "HIT_PENDING", lr.RETRY: "RETRY", lr.MISS: "MISS"}
        self.bool_names = {True: "HIT", None: "HIT_PENDING", False: "MISS"}  # 0.21-0.24

    def is_answer(self, r):
        try:
            return r in self.names
        except TypeError:  # unhashable: no LookupResult
            return False

    def answer_name(self, r):
        if self.is_answer(r):
            return self.names[r]
        return self.bool_names.get(r if r is None else bool(r), "MISS")

    def subscribe(self, tap):
        cap = self

        def lookup(call, key, *a, **k):
            if cap.extra_key is not None and cap.asked is not None:  # planted: lookup_extra_key
                extra, cap.extra_key = cap.extra_key, None
                cap.asked.append((extra, call(extra, *a, **k)))
            r = call(key, *a, **k)
            if cap.asked is not None:
                cap.asked.append((key, r))
            return r

        tap.around(self.cs.manager, "lookup", lookup)
        tap.subscribe("tier_lookup_late_answer", self.late_answer)

    def late_answer(self, request_ids):
        """A late lookup answer reached the tier for these requests' keys: their waits start again."""
        for rid in request_ids:
            self.deferred_since.pop(rid, None)

    # -- one call ---------------------------------------------------------------------------
    def call(self, orig, request, num_computed_tokens, a, k):
        cs = self.cs
        rid = request.request_id
        st = getattr(cs, "_req_status", {}).get(rid)
        transfer_jobs = bool(getattr(st, "transfer_jobs", None)) if st is not None else False
        prior_boundary = getattr(st, "partial_tail_boundary", None)
        loading = first_attr(cs, "_chunks_being_loaded", "_blocks_being_loaded", default=None)
        being_loaded = set(loading) if loading else set()
        mutant = self.eng.mutant
        self.asked = []
        if mutant == "lookup_extra_key" and request.block_hashes:
            # planted: the lookup also asks, first, the key of the request's last block hash
            gi = getattr(cs.config.kv_group_configs[0], "group_idx", 0)
            self.extra_key = self.eng.rel.obase.make_offload_key(request.block_hashes[-1], gi)
        try:
            res = orig(request, num_computed_tokens, *a, **k)
        finally:
            asked, self.asked, self.extra_key = self.asked, None, None
        hit = res[0]
        try:
            case, real_extra = self.describe(request, num_computed_tokens, asked, transfer_jobs,
                                             being_loaded, prior_boundary, a, k)
        except Exception as e:  # noqa: BLE001 - a harness fault, never a vLLM finding
            self.eng.violations.append({"check": "harness:capture", "step": self.eng.step_no,
                                        "request": rid, "error": "lookup: %s: %s" % (type(e).__name__, e)})
            case = None
        real_hit = hit
        if case is not None and mutant and mutant.startswith("lookup_"):
            hit = self.mutate(mutant, rid, hit, case, asked)
            if hit != real_hit:
                res = (hit, bool(hit)) if hit is not None else (None, False)
        if case is not None:
            st = cs._req_status.get(rid)
            foreign = [repr(r) for _, r in asked if self.names and not self.is_answer(r)]
            self.lookups.append({
                "step": self.eng.step_no, "request": rid, "case": case,
                "real": {"hit": hit, "partial_tail_boundary": getattr(st, "partial_tail_boundary", None)
                         if hit == real_hit else None,
                         "queries": real_extra["queries"]},
                "spec_hit_shift": None if hit == real_hit else [real_hit, hit],
            })
            if foreign:
                self.lookups[-1]["foreign_answers"] = foreign[:8]
        self.progress(request, hit, case)
        return res

    def describe(self, request, N, asked, transfer_jobs, being_loaded, prior_boundary, a, k):
        cs = self.cs
        cfg = cs.config
        rel = self.eng.rel
        ob = rel.obase
        st = cs._req_status[request.request_id]
        tph = tokens_per_hash(cfg)
        hashes = list(request.block_hashes)
        name_of = {}
        groups = []
        tier = {}
        policy = getattr(cs.manager, "_policy", None)
        kv_groups = self.eng.kv_cache_config.kv_cache_groups
        for ci, (g, gs) in enumerate(zip(cfg.kv_group_configs, st.group_states)):
            gi = getattr(g, "group_idx", ci)
            tpc = first_attr(g, "tokens_per_chunk", "offloaded_block_size", default=None)
            window = first_attr(g, "sliding_window_size_in_chunks", "sliding_window_size_in_blocks", default=None)
            keys = list(gs.offload_keys)
            for c, key in enumerate(keys):
                name_of.setdefault(key, "%d:%d" % (gi, c))
            spec = getattr(g, "kv_cache_spec", None) or kv_groups[gi].kv_cache_spec
            kind = kind_of(spec)
            groups.append({"group_idx": gi, "kind": kind, "tokens_per_chunk": tpc, "num_keys": len(keys),
                           "window": window, "sliding_window": int(getattr(spec, "sliding_window", 0) or 0),
                           "extra_retained_tokens": int(getattr(spec, "extra_retained_tokens", 0) or 0),
                           "eagle": bool(getattr(g, "is_eagle_group", False)),
                           "requires_cow_source": bool(getattr(g, "requires_cow_source", False))})
            for i, h in enumerate(hashes):
                key = ob.make_offload_key(h, gi)
                name_of.setdefault(key, "%d:b:%d" % (gi, (i + 1) * tph))
            if policy is not None:
                for c in range(N // tpc, len(keys)):
                    tier["%d:%d" % (gi, c)] = [self.probe(policy, keys[c])]
        queries = []
        seen = set()
        for key, r in asked:
            nm = name_of.get(key, "unknown")
            queries.append(nm)
            if nm not in seen:
                tier[nm] = []
                seen.add(nm)
            tier[nm].append(self.answer_name(r))
        margins = getattr(cs, "_eagle_proof_margins", None) or {}
        case = {"name": "trace-s%d-%s" % (self.eng.step_no, request.request_id), "lookup": {
            "release": rel.version, "num_computed_tokens": N, "num_tokens": request.num_tokens,
            "num_prompt_tokens": request.num_prompt_tokens, "groups": groups,
            "lookup_groups": list(getattr(cs, "_lookup_groups", ()) or ()),
            "tokens_per_hash": tph, "num_block_hashes": len(hashes), "tier": tier,
            "mamba_align_size": getattr(cs, "_mamba_align_size", None),
            "partial_tail_block_size": int(getattr(cs, "_partial_tail_block_size", 0) or 0)
            if getattr(cfg, "supports_partial_tail", False) else 0,
            "eagle_proof_margins": {str(x): int(v) for x, v in margins.items()},
            "max_num_new_tokens": a[0] if a else k.get("max_num_new_tokens"),
            "max_load_tokens": getattr(st, "max_load_tokens", None),
            "transfer_jobs": transfer_jobs,
            "skip_reading": bool(getattr(request, "skip_reading_prefix_cache", False)),
            "being_loaded": sorted(name_of.get(x, "unknown") for x in being_loaded
                                   if x in name_of),
        }}
        if prior_boundary is not None:  # what an early return leaves recorded (spec/lookup.py)
            case["lookup"]["prior_partial_tail_boundary"] = int(prior_boundary)
        return case, {"queries": queries}

    def probe(self, policy, key):
        b = policy.get(key)
        if b is None:
            return "MISS"
        return "HIT" if b.is_ready else "HIT_PENDING"

    # -- planted defects (tests only) ------------------------------------------------------------
    def mutate(self, mutant, rid, hit, case, asked):
        lk = case["lookup"]
        tpc = max(g["tokens_per_chunk"] for g in lk["groups"])
        if mutant == "lookup_drop_last_chunk" and hit:
            return hit - tpc if hit > tpc else 0
        if mutant == "lookup_defer_any_pending":  # any key the tier holds pending, needed or not
            table = getattr(getattr(self.cs.manager, "_policy", None), "chunks", None) or \
                getattr(getattr(self.cs.manager, "_policy", None), "blocks", None) or {}
            if hit and any(not b.is_ready for b in table.values()):
                return None
        if mutant == "lookup_never_return":
            if rid in self.never:
                return None
            if hit is None:
                self.never.add(rid)
        if mutant == "lookup_extra_chunk" and hit:
            # claim the chunk after the hit where the tier does not hold it ready
            g = lk["groups"][0]
            c = (lk["num_computed_tokens"] + hit) // g["tokens_per_chunk"]
            if (c < g["num_keys"] and hit + tpc <= lk["num_tokens"] - 1 - lk["num_computed_tokens"]
                    and lk["tier"].get("%d:%d" % (g["group_idx"], c), ["MISS"])[-1] != "HIT"):
                return hit + tpc
        return hit

    # -- progress --------------------------------------------------------------------------------
    def progress(self, request, hit, case):
        rid = request.request_id
        step = self.eng.step_no
        if hit is not None:
            self.deferred_since.pop(rid, None)
            return
        row = self.deferred_since.setdefault(rid, [step, 0])
        row[1] += 1
        since, times = row
        if times > STUCK_BOUND_LOOKUPS and rid not in self.stuck:
            self.stuck.add(rid)
            waits = []
            if case is not None:
                lk = case["lookup"]
                waits = sorted(n for n, v in lk["tier"].items() if v and v[-1] in ("HIT_PENDING", "RETRY"))
                if lk["transfer_jobs"]:
                    waits.append("transfer_jobs")
            stalled = sorted(set(getattr(self.cs.manager, "kvbound_stalled_names", lambda: [])()))
            self.eng.violations.append({
                "check": "liveness:stuck_request", "step": step, "request": rid,
                "message": "deferred by its lookup %d times in a row since step %d (bound %d); waits on %s;"
                           " transfers in flight: %d; stalled tier writes: %d"
                           % (times, since, STUCK_BOUND_LOOKUPS, ", ".join(waits[:8]) or "nothing",
                              len(self.eng.transfers.pending), len(stalled)),
                "deferred_since": since, "deferrals": times, "waits_on": waits[:32],
                "transfers_in_flight": len(self.eng.transfers.pending), "stalled_writes": len(stalled)})
            self.to_abort.append(rid)  # so the run drains; the finding is recorded

    def take_aborts(self):
        out, self.to_abort = self.to_abort, []
        return out
