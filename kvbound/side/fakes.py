"""The fakes of ``kvbound trace``: what stands in for the model, the transfer engine and
(optionally) an adversarial offload tier. Everything else the worker runs is vLLM's own.

Part of the side package, loaded inside the release's side venv (standard library and vLLM
only, imported lazily); importable on the host too, as ``kvbound.side.fakes``, for unit tests
of the pure parts.

- tokens: the seeded documents, fillers and sampled tokens every prompt is made of;
- ``FakeTransferEngine``: the ``OffloadingWorker`` the connector's worker side submits
  jobs to; a job finishes 0..``max_delay`` steps after submission, a load fails with
  probability ``fail_p``;
- ``FakeModelRunner``: the model runner's output (sampled tokens, drafts);
- the scripted tier: vLLM's CPU tier through the spec factory's out-of-tree path,
  answering HIT_PENDING/RETRY and evicting between a lookup and its load.
"""

import random
import sys
import types

def tok(doc, i):
    """Token i of shared document ``doc`` (documents are what prompts share)."""
    return 1 + (doc * 7919 + i * 104729) % 60000


def out_tok(rid, i):
    """The i-th token the fake model samples for request ``rid``."""
    return 1 + (rid * 31337 + i * 977) % 60000


def prompt_tokens(segments):
    """A prompt from segments: ["doc", d, start, n] (document d's tokens [start, start+n)),
    ["out", rid, n] (request rid's first n sampled tokens), ["uniq", rid, n]."""
    toks = []
    for s in segments:
        if s[0] == "doc":
            toks += [tok(s[1], i) for i in range(s[2], s[2] + s[3])]
        elif s[0] == "out":
            toks += [out_tok(s[1], i) for i in range(s[2])]
        else:  # uniq
            toks += [tok(100000 + s[1], i) for i in range(s[2])]
    return toks



TIER_MODULE = "kvbound_trace_tier"


def install_scripted_tier(obase):
    """An out-of-tree offload tier for vLLM's spec factory (``kv_connector_extra_config``
    ``spec_name``/``spec_module_path``, ``v1/kv_offload/factory.py``): vLLM's own CPU tier
    with a script (extra config ``kvbound_script``) that makes it adversarial:
    ``pending_p``: a lookup that would HIT answers HIT_PENDING once (not yet readable),
    ``retry_p``: ... answers RETRY once (location unknown), each for the step (a key asked
    again in the same step is answered the same: the tier's state holds), and ``evict_p``: at each
    schedule end, every idle ready chunk some lookup answered HIT in that step is evicted
    with this probability (between a lookup and a later ``prepare_load``)."""
    if TIER_MODULE in sys.modules:
        return
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    class KvboundScriptedSpec(CPUOffloadingSpec):
        def get_manager(self):
            m = super().get_manager()
            if not getattr(m, "_kvbound_script", None):  # played by script_tier, through the tap
                m._kvbound_script = dict(self.extra_config.get("kvbound_script") or {})
            return m

    mod = types.ModuleType(TIER_MODULE)
    mod.KvboundScriptedSpec = KvboundScriptedSpec
    sys.modules[TIER_MODULE] = mod


class _BoolLookup:
    """The pre-0.25 lookup answers under LookupResult's names: pending and retry are both
    None ("the lookup should be retried later")."""

    MISS, HIT, HIT_PENDING, RETRY = False, True, None, None


def script_tier(m, obase, tap):
    """Play the script ``KvboundScriptedSpec`` left on its manager ``m``: its ``lookup``,
    ``on_schedule_end`` and ``complete_store``, subscribed to ``tap`` (first: the tier's own
    behaviour, inside every checker)."""
    # 0.25 made lookup answer a LookupResult (0.25.1 v1/kv_offload/base.py:56-62); before, it
    # answers True/False, or None for "retry later" (0.24.0 v1/kv_offload/base.py:162-176).
    LR = getattr(obase, "LookupResult", None) or _BoolLookup
    script = m._kvbound_script
    rng = random.Random(script.get("seed", 0))
    pending_p, retry_p, evict_p = (float(script.get(k, 0.0)) for k in ("pending_p", "retry_p", "evict_p"))
    m.kvbound_evicted = []  # keys the script evicted, in order (the harness reads them)
    m.kvbound_counts = {"pending": 0, "retry": 0, "evicted": 0}
    delayed = set()  # (request id, key) answered PENDING/RETRY once already
    hit_now = []
    # The CPU tier counted "blocks" before 0.30 and "chunks" since (0.29.0
    # v1/kv_offload/cpu/manager.py:61,96 _num_evictable_cache_blocks/_free_block; 0.30.0
    # manager.py:61,96 _num_evictable_cache_chunks/_free_chunk), and kept no such count before
    # 0.24 (0.23.0 cpu/policies/lru.py:42-55 scans ref_cnt): probed by feature.
    evictable = next((a for a in ("_num_evictable_cache_chunks", "_num_evictable_cache_blocks")
                      if hasattr(m, a)), None)
    free = getattr(m, "_free_chunk", None) or m._free_block

    def evict(keys):
        evicted = []
        for key in dict.fromkeys(keys):
            chunk = m._policy.get(key)
            if chunk is None or not chunk.is_ready or chunk.ref_cnt != 0:
                continue
            m._policy.remove(key)
            if evictable is not None:
                setattr(m, evictable, getattr(m, evictable) - 1)
            free(chunk)
            evicted.append(key)
        if evicted:
            m.kvbound_evicted.extend(evicted)
            m.kvbound_counts["evicted"] += len(evicted)
            if m.events is not None:
                m.events.append(_evict_event(m, evicted))

    # (request id, key) -> the answer given in this step: a tier's state holds within a step (the
    # CPU tier changes a chunk's state only in prepare_store / complete_store / its schedule end,
    # never between two lookups of one scheduling pass), so a key asked again (the lookup's
    # convergence loop, the partial-tail search) is answered as it was first
    answered = {}

    def lookup(call, key, req_context):
        r = call(key, req_context)
        if r is not LR.HIT:
            return r
        hit_now.append(key)
        tag = (getattr(req_context, "req_id", None), key)
        got = r
        if tag not in delayed:
            x = rng.random()  # drawn at every ask, answered before or not: the script's stream is kept
            if script.get("evict_at_lookup"):  # tests only: a tier that breaks its contract
                evict([key])
            if tag in answered:
                pass
            elif x < pending_p:
                delayed.add(tag)
                m.kvbound_counts["pending"] += 1
                got = LR.HIT_PENDING
            elif x < pending_p + retry_p:
                delayed.add(tag)
                m.kvbound_counts["retry"] += 1
                got = LR.RETRY
        return answered.setdefault(tag, got)

    def on_schedule_end(call, *context):  # no ScheduleEndContext before 0.25 (0.24.0 base.py:305)
        call(*context)
        evict([key for key in hit_now if rng.random() < evict_p])
        del hit_now[:]
        answered.clear()

    tap.around(m, "lookup", lookup)
    tap.around(m, "on_schedule_end", on_schedule_end)
    _script_stalled_writes(m, script, tap)
    _script_refused_stores(m, script, tap)


def _script_refused_stores(m, script, tap):
    """``refuse_p``: a ``prepare_store`` answers None with this probability per call, before
    the tier allocates anything ("None is returned if the blocks cannot be stored", 0.33.0
    v1/kv_offload/base.py:389-393; the CPU tier's own refusal when it cannot evict enough,
    cpu/manager.py ``prepare_store``). Its own seeded stream. The planted ``refusal_leaks``
    (tests only) refuses after the tier allocated: the chunks stay write-pending for ever."""
    refuse_p = float(script.get("refuse_p", 0.0))
    if not refuse_p:
        return
    rng = random.Random("refuse-%s" % script.get("seed", 0))
    m.kvbound_counts["refused"] = 0

    def prepare_store(call, keys, *a, **k):
        if rng.random() >= refuse_p:
            return call(keys, *a, **k)
        m.kvbound_counts["refused"] += 1
        if script.get("refusal_leaks"):  # planted: a tier that refuses what it already allocated
            call(keys, *a, **k)
        return None

    tap.around(m, "prepare_store", prepare_store)


def _script_stalled_writes(m, script, tap):
    """``stall_p``: a store the transfer engine completed is, with this probability per
    key, never made readable by the tier (its write stalls: the key answers HIT_PENDING
    for as long as the engine runs). Its own seeded stream, so adding it leaves the
    other answers of a script as they were."""
    stall_p = float(script.get("stall_p", 0.0))
    m.kvbound_stalled = []
    m.kvbound_stalled_names = lambda: list(range(len(m.kvbound_stalled)))
    if not stall_p:
        return
    rng = random.Random("stall-%s" % script.get("seed", 0))

    def complete_store(call, keys, *a, **k):
        success = k.get("success", a[-1] if a and isinstance(a[-1], bool) else True)
        keys = list(keys)
        if success:
            stalled = [key for key in keys if rng.random() < stall_p]
            if stalled:
                m.kvbound_stalled.extend(stalled)
                m.kvbound_counts["stalled"] = m.kvbound_counts.get("stalled", 0) + len(stalled)
                keys = [key for key in keys if key not in stalled]
        return call(keys, *a, **k)

    tap.around(m, "complete_store", complete_store)


def _evict_event(m, keys):
    from vllm.v1.kv_offload.base import OffloadingEvent

    return OffloadingEvent(keys=keys, medium=m.medium, removed=True)


# The steps a late completion or answer comes late by, unless the engine setting late_steps says (long
# enough for its request to be preempted and re-admitted meanwhile): the transfer faults' and the tier
# clock's (side/tier_clock.py, tier_lookup_late_p).
LATE_STEPS = 16


class TransferFaults:
    """The fake transfer engine's faults (engine settings, off unless set), drawn from their
    own seeded stream so that turning them on leaves every other draw as it was:
    ``store_fail_p``: a store job finishes ``TransferResult(success=False)`` and moves
    nothing; ``late_p``: a job's completion (and its copy's latest moment) comes
    ``late_steps`` steps later than its delay, long enough for its request to be preempted
    and re-admitted meanwhile. Planted (tests only, ``mutant``): ``failed_transfer_reported_ok``
    (one job in five moves nothing, yet is reported a success) and ``late_reported_on_time``
    (a late job is reported finished at its on-time step while its copy still lands late)."""

    def __init__(self, par, mutant):
        self.store_fail_p = float(par.get("store_fail_p") or 0.0)
        self.late_p = float(par.get("late_p") or 0.0)
        self.late_steps = int(par.get("late_steps") or LATE_STEPS)
        self.mutant = mutant
        self.rng = random.Random("faults-%s" % par.get("seed", 0))
        self.counts = {}
        self.early = {}  # job id -> steps until its copy lands (late_reported_on_time)
        self.late = set()  # ids of the jobs a late fault holds

    def held_past(self, preempted, jobs):
        """Count the late jobs in flight (``jobs``: the shadow's, by id) whose request the
        scheduler just preempted: completions that arrive after a preemption."""
        for jid in self.late & set(jobs):
            if jobs[jid].rid in preempted:
                self.count("late_past_preemption")

    def count(self, what):
        self.counts[what] = self.counts.get(what, 0) + 1

    def store_ok(self):
        if self.store_fail_p and self.rng.random() < self.store_fail_p:
            self.count("failed_stores")
            return False
        return True

    def lateness(self):
        if self.late_p and self.rng.random() < self.late_p:
            self.count("late_jobs")
            return self.late_steps
        return 0

    def moves(self, ok):
        """Whether the job moves its content (a planted failure reported ok moves nothing)."""
        if ok and self.mutant == "failed_transfer_reported_ok" and self.rng.random() < 0.2:
            self.count("planted_failures")
            return False
        return ok


def fake_transfer_engine_class(obase):
    base = getattr(obase, "OffloadingWorker", None)
    if base is None:
        # Before 0.25 the connector's worker side owns a concrete OffloadingWorker that routes
        # ``transfer_async(job_id, (src, dst))`` to handlers by medium (0.24.0
        # v1/kv_offload/worker/worker.py:77-140; offloading/worker.py:39,273-297); 0.25 made it
        # the abstract ``base.OffloadingWorker`` with submit_store/submit_load (0.25.1
        # v1/kv_offload/base.py:459). Probed by feature, not by release.
        return _legacy_fake_transfer_engine_class(obase)

    class KvboundFakeTransferEngine(base):
        """A job finishes ``delay`` steps after submission (0..max_delay), a load fails with
        probability ``fail_p`` (``TransferResult(success=False)``, the worker API's report).
        With shadow KV on (``eng.shadow``) it moves content: each job copies its blocks at a
        seeded moment between submission and completion (``tier.TierTransfers``)."""

        def __init__(self, rng, max_delay, fail_p, eng):
            self.rng, self.max_delay, self.fail_p, self.eng = rng, max_delay, fail_p, eng
            self.pending = {}  # job_id -> [steps_left, success, kind]
            self.submitted = {}
            self.faults = TransferFaults(eng.par, eng.mutant)
            self.sizes = {}  # job_id -> (bytes, steps held): what the job's TransferResult reports
            self.reported = {}  # "load" / "store" -> the bytes of each finished job reported with its size
            # the release's TransferResult reports what a job moved and how long it took (0.30+,
            # 0.33.0 v1/kv_offload/base.py:650-654), as the CPU tier's worker measures it
            fields = getattr(obase.TransferResult, "__dataclass_fields__", {})
            self.reports_size = "transfer_size" in fields and "transfer_time" in fields
            # and, before 0.25, its direction as (source medium, destination medium), which the
            # connector's worker requires before it records a transfer's stats (0.21.0
            # cpu/gpu_worker.py:169,355-361 sets it; offloading/worker.py:328-337 reads it)
            self.reports_type = "transfer_type" in fields

        def _schedule(self, job_id, kind, delay, ok, src_spec, dst_spec, may_be_late=True):
            """Hold the job ``delay`` steps (plus a late fault's) and tell the shadow when it
            copies; the reported success may differ from what it moved (planted only)."""
            late = self.faults.lateness() if delay is not None and may_be_late else 0
            if late:
                self.faults.late.add(job_id)
            copy_delay = self.max_delay if delay is None else delay + late
            if self.reports_size:
                gpu = src_spec if kind == "store" else dst_spec
                self.sizes[job_id] = (self._bytes(gpu), copy_delay)
            if delay is not None:
                on_time = self.faults.mutant == "late_reported_on_time" and late
                self.pending[job_id] = [delay if on_time else delay + late, ok, kind]
                if on_time:  # planted: reported at its on-time step, its copy still lands late
                    self.faults.early[job_id] = late
            sh = self._tier()
            if sh is not None:
                sh.submit(kind, job_id, src_spec, dst_spec, copy_delay, self.faults.moves(ok))

        def _bytes(self, gpu_spec):
            """The bytes a job moves: each offloaded group's GPU blocks times the bytes of one of
            its blocks, every layer of the group (a per-layer page times its layers, a uniform-type
            spec's page whole: 0.33.0 offloading/config.py:48-58 ``_group_kv_bytes_per_block``)."""
            groups = self.eng.csched.config.kv_group_configs
            sizes = list(gpu_spec.group_sizes) if getattr(gpu_spec, "group_sizes", None) is not None \
                else [len(gpu_spec.block_ids)]
            kcg = self.eng.kv_cache_config.kv_cache_groups

            def block_bytes(group):
                spec = group.kv_cache_spec
                layers = 1 if type(spec).__name__ == "UniformTypeKVCacheSpecs" else len(group.layer_names)
                return spec.page_size_bytes * layers
            return sum(int(n) * block_bytes(kcg[getattr(gc, "group_idx", i)]) for i, (n, gc) in enumerate(zip(sizes, groups)))

        def _result(self, job_id, ok):
            size = self.sizes.pop(job_id, None)
            if size is None:
                return obase.TransferResult(job_id=job_id, success=ok)
            kind = self.submitted[job_id]
            self.reported.setdefault(kind, []).append(size[0])  # stats_logger's check
            # the time: the steps the job was held, at a modelled millisecond each (no clock)
            more = {"transfer_type": ("GPU", "CPU") if kind == "store" else ("CPU", "GPU")} if self.reports_type else {}
            return obase.TransferResult(job_id=job_id, success=ok, transfer_size=size[0],
                                        transfer_time=1e-3 * (size[1] + 1), **more)

        def _tier(self):
            sh = getattr(self.eng, "shadow", None)
            return None if sh is None else sh.transfers

        def submit_store(self, job_id, src_spec, dst_spec):
            delay = None
            if self.eng.mutant != "lost_store":  # planted defect: a store that never completes
                delay = self.rng.randint(0, self.max_delay)
            self.submitted[job_id] = "store"
            self.eng.on_submit("store", job_id, src_spec)
            self._schedule(job_id, "store", delay, self.faults.store_ok(), src_spec, dst_spec)
            return True

        def submit_load(self, job_id, src_spec, dst_spec, expedited=False):
            ok = self.rng.random() >= self.fail_p
            delay = 0 if expedited else self.rng.randint(0, self.max_delay)
            self.submitted[job_id] = "load"
            self.eng.on_submit("load", job_id, dst_spec)
            # an expedited (sync) load is waited on within the step (0.33.0 offloading/worker.py:269-270)
            self._schedule(job_id, "load", delay, ok, src_spec, dst_spec, may_be_late=not expedited)
            return True

        def get_finished(self):
            sh = self._tier()
            if sh is not None:
                sh.tick()
            done = []
            early = self.faults.early
            for j in sorted(early):  # planted late_reported_on_time: the copies land now
                if j not in self.pending:
                    early[j] -= 1
                    if early[j] < 0:
                        del early[j]
                        if sh is not None:
                            sh.complete(j)
            for j, v in list(self.pending.items()):
                if v[0] <= 0:
                    if sh is not None and j not in early:
                        sh.complete(j)
                    done.append(self._result(j, v[1]))
                    del self.pending[j]
                else:
                    v[0] -= 1
            return done

        def wait(self, job_ids):
            sh = self._tier()
            if sh is not None:
                sh.flush(job_ids)
            for j in job_ids:
                if j in self.pending:
                    self.pending[j][0] = 0

    return KvboundFakeTransferEngine


def _legacy_fake_transfer_engine_class(obase):
    """The same fake (the same methods, shadow KV included) for the pre-0.25 API: one
    ``transfer_async(job_id, (src, dst))``, a load when the destination is the GPU
    (``GPULoadStoreSpec.medium()``), results the release's own ``TransferResult``. Those
    releases assert every transfer succeeded (0.24.0 offloading/worker.py:309), so keep
    ``fail_p`` 0 there."""
    from vllm.v1.kv_offload.worker import worker as w0

    modern = fake_transfer_engine_class(types.SimpleNamespace(OffloadingWorker=object,
                                                              TransferResult=w0.TransferResult))

    class KvboundFakeTransferEngine(modern, w0.OffloadingWorker):
        def __init__(self, rng, max_delay, fail_p, eng):
            w0.OffloadingWorker.__init__(self)
            modern.__init__(self, rng, max_delay, fail_p, eng)

        def transfer_async(self, job_id, spec):
            src, dst = spec
            if dst.medium() == obase.GPULoadStoreSpec.medium():  # CPU -> GPU: a load
                return self.submit_load(job_id, src, dst)
            return self.submit_store(job_id, src, dst)

    return KvboundFakeTransferEngine


class FakeModelRunner:
    """The model runner's output for a scheduled batch: one sampled token per request whose
    prefill is complete (``out_tok``), and, with speculative decoding, the drafter's
    proposals and their acceptance."""

    def __init__(self, eng, num_spec, accept_p):
        self.eng, self.num_spec, self.accept_p = eng, num_spec, accept_p

    def output(self, so, kv_out):
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.eng.sched.requests.get(rid)
            if req is not None and req.num_computed_tokens >= req.num_tokens:
                # async: this step's token is already counted as a placeholder
                idx = req.num_output_tokens + max(0, getattr(req, "num_output_placeholders", 0) - 1)
                # speculative decoding: the drafts the fake model would have sampled are
                # accepted up to the first wrong one, plus one bonus token
                drafts = (getattr(so, "scheduled_spec_decode_tokens", None) or {}).get(rid, ())
                toks = []
                for d in drafts:
                    if d != out_tok(int(rid), idx + len(toks)):
                        break
                    toks.append(d)
                self.eng.stats["accepted"] += len(toks)
                sampled.append(toks + [out_tok(int(rid), idx + len(toks))])
            else:
                sampled.append([])
        return self.eng.rel.vout.ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled, kv_connector_output=kv_out)

    def propose_drafts(self, so):
        """The drafter's proposals after a sync step (the engine core's
        ``take_draft_token_ids`` -> ``update_draft_token_ids``): ``num_speculative_tokens``
        per request that sampled, each right with probability ``accept_p``."""
        ids, drafts = [], []
        for rid in so.num_scheduled_tokens:
            req = self.eng.sched.requests.get(rid)
            if req is None or req.is_finished() or req.num_computed_tokens < req.num_tokens - 1:
                continue
            d = []
            for i in range(self.num_spec):
                t = out_tok(int(rid), req.num_output_tokens + i)
                d.append(t if self.eng.rng.random() < self.accept_p else 1 + (t % 59999))
            ids.append(rid)
            drafts.append(d)
            self.eng.stats["drafts"] += len(d)
        if ids:
            self.eng.sched.update_draft_token_ids(
                self.eng.rel.vout.DraftTokenIds(req_ids=ids, draft_token_ids=drafts))


def sampling_extras(r):
    """A request's SamplingParams beyond its length: prompt logprobs, so it skips reading the prefix
    cache (0.33.0 sampling_params.py:625-632), and kv_transfer_params, which Request reads from
    extra_args (0.33.0 v1/request.py:120)."""
    sp = {}
    if r.get("prompt_logprobs") is not None:
        sp["prompt_logprobs"] = r["prompt_logprobs"]
    if r.get("kv_transfer_params") is not None:
        sp["extra_args"] = {"kv_transfer_params": r["kv_transfer_params"]}
    return sp
