"""Standalone reproducer: a sync KV-connector load on a full-attention + Mamba(align)
hybrid takes one block more than vLLM's own admission check reserved.

Drives vLLM's real ``KVCacheManager`` (coordinator, single-type managers, block pool)
with exactly the arguments ``Scheduler.schedule()`` passes for a request whose
connector hit loads synchronously (0.33.0 ``v1/core/sched/scheduler.py:1435-1451``:
``load_kv_async`` False, so ``num_new_tokens`` > 0 together with
``num_external_computed_tokens`` > 0). Nothing of vLLM is faked or patched; the
KVCacheConfig is the two-group hybrid vLLM's own tests build (one shared pool, both
groups at the same block size, Mamba in ``align`` mode).

Run it in a release's import venv (kvbound need not be installed: the side package's vLLM
adapter is loaded from this checkout by path):

    PYTHONPATH=~/.cache/kvbound/vllm-0.33.0 ~/.cache/kvbound/deps-*/bin/python \\
        scripts/repro_0_33_sync_mamba.py [--json] [--plant-fix]

One request, one ``allocate_slots`` call: prompt P = 320 tokens, no local hit (N = 0),
M = 64 tokens from the connector, the remaining 256 scheduled in the same step.
Pass 1 (roomy pool) measures what admission reserved and what allocation took;
pass 2 gives the pool exactly the reserved number of free blocks, as memory pressure
does, and the allocation raises ``ValueError: Cannot get 1 free blocks from the pool``.

``--calls FILE`` replays allocate_slots calls instead (a JSON list of call specs, e.g. a
``kvbound prove`` witness of ``reservation.*`` turned into one by tests/test_reservation.py):
each on a fresh manager whose KV-cache groups are full attention plus the spec's kind, its local
hit made by a first request (kept running or freed), then the request's first call and its
running call; per group, what get_num_blocks_to_allocate reserved (the step call, not the
admission gate) and how many blocks left the free queue in add_local_computed_blocks,
allocate_external_computed_blocks and allocate_new_blocks. Prints one JSON list.

A spec with ``"plant_fix": true`` is replayed with the fix below planted for that call only.

``--plant-fix`` wraps ``MambaManager.get_num_blocks_to_allocate`` at runtime so that it
also counts the loaded-state block (the suggested fix direction); the reproducer
must then report reserved == taken and no exception (how tests/test_finding_0_33.py
shows its check can fail).
"""

import argparse
import json
import sys

from repro_support import side_package

side_package()  # kvbound_side.adapter: vLLM on CPU

B = 64  # tokens_per_block of both groups (== hash block size)
P, N, M = 320, 0, 64  # prompt, local hit, connector hit
NEW = P - N - M  # tokens scheduled in the same step as the sync load


def _cdiv(a, b):
    return -(-a // b)


def _call(fn, *a, **kw):
    """fn with only the keyword arguments this release's signature has (prefill_end,
    full_sequence_must_fit and has_scheduled_reqs are newer than 0.30)."""
    import inspect

    params = inspect.signature(fn).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kw = {k: x for k, x in kw.items() if k in params}
    return fn(*a, **kw)


def _imports():
    from kvbound_side import adapter
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager
    from vllm.v1.request import Request

    sha256 = adapter.hashing()
    return locals()


def plant_fix(v):
    """Runtime-only planted fix: a first allocation that adopts connector tokens AND
    schedules new ones past the loaded-state block gets one more Mamba block. Returns
    a function that takes it out again."""
    MambaManager = v["MambaManager"]
    orig = MambaManager.get_num_blocks_to_allocate

    def fixed(self, request_id, num_tokens, new_computed_blocks, total_computed_tokens,
              num_local_computed_tokens, num_tokens_main_model, *a, **k):
        n = orig(self, request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                 num_local_computed_tokens, num_tokens_main_model, *a, **k)
        first = len(self.req_to_blocks.get(request_id, ())) == 0
        external = total_computed_tokens > num_local_computed_tokens
        past = _cdiv(num_tokens_main_model, self.block_size) > _cdiv(total_computed_tokens, self.block_size)
        if (getattr(self, "mamba_cache_mode", "align") == "align" and first and external and past
                and n <= self.block_pool.num_gpu_blocks):
            n += 1
        return n

    MambaManager.get_num_blocks_to_allocate = fixed

    def unplant():
        MambaManager.get_num_blocks_to_allocate = orig

    return unplant


def build(v, num_blocks):
    a = v["adapter"]
    # no kv_cache_tensors: the manager never reads them (vLLM's tests pass [] too)
    cfg = a.kv_cache_config([a.kv_cache_spec({"kind": kind, "tokens_per_block": B})
                             for kind in ("full_attention", "mamba")], num_blocks, layer_names=["attn", "mamba"])
    for field, val in (("hash_block_size", B), ("cache_hit_alignment_tokens", B)):
        if hasattr(cfg, field):
            setattr(cfg, field, val)
    return v["KVCacheManager"](cfg, max_model_len=8192, scheduler_block_size=B, hash_block_size=B,
                               enable_caching=True)


def request(v):
    hasher = v["kcu"].get_request_block_hasher(B, v["sha256"])
    return v["Request"](request_id="C", prompt_token_ids=list(range(1000, 1000 + P)),
                        sampling_params=v["SamplingParams"](max_tokens=8), pooling_params=None,
                        block_hasher=hasher)


def table(mgr, req_id):
    rows = []
    for m in mgr.coordinator.single_type_managers:
        rows.append([None if b.is_null else b.block_id for b in m.req_to_blocks.get(req_id, [])])
    return rows


def one_pass(v, num_blocks=None):
    """Returns dict(reserved, taken, free_before, error, tables)."""
    mgr = build(v, num_blocks or 64)
    req = request(v)
    empty = mgr.empty_kv_cache_blocks
    # What admission computes for this call (the same call allocate_slots makes,
    # kv_cache_manager.py: get_num_blocks_to_allocate before the free-block check).
    reserved = _call(mgr.coordinator.get_num_blocks_to_allocate,
        request_id=req.request_id, num_tokens=N + M + NEW, new_computed_blocks=empty.blocks,
        num_encoder_tokens=0, total_computed_tokens=N + M, num_local_computed_tokens=N,
        num_tokens_main_model=N + M + NEW, prefill_end=P)
    per_group = [_call(m.get_num_blocks_to_allocate, req.request_id, N + M + NEW, (), N + M, N, N + M + NEW,
                                              prefill_end=P)
                 for m in mgr.coordinator.single_type_managers]
    if num_blocks is None:  # pass 2: exactly `reserved` free blocks (+1 null block)
        mgr = build(v, reserved + 1)
        req = request(v)
        empty = mgr.empty_kv_cache_blocks
    free_before = mgr.block_pool.get_num_free_blocks()
    err = None
    got = "not called"
    try:
        # The scheduler's call for a sync load (scheduler.py:1435-1451 in 0.33.0).
        out = _call(mgr.allocate_slots, req, NEW, num_new_computed_tokens=N, new_computed_blocks=empty,
                                 num_external_computed_tokens=M, delay_cache_blocks=False,
                                 full_sequence_must_fit=True, has_scheduled_reqs=False)
        got = "None (not admitted)" if out is None else "blocks"
    except ValueError as e:
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if "/vllm/" in f.filename]
        where = " -> ".join("%s:%d %s" % (f.filename.split("/vllm/", 1)[1], f.lineno, f.name)
                            for f in frames)
        err = "ValueError: %s   [%s]" % (e, where)
    taken = free_before - mgr.block_pool.get_num_free_blocks()
    return dict(reserved=reserved, reserved_per_group=per_group, free_before=free_before,
                taken=taken, result=got, error=err, tables=table(mgr, req.request_id))


def local_hit_pass(v, keep_running):
    """A sync load on top of a local hit: request A computes the first 2 blocks; C shares
    them (N = 2b), loads M = 2b more and computes the rest of a 7-block prompt in the
    same step. keep_running: A still holds its blocks (a shared prefix in use), else A
    is freed and its blocks wait, cached, in the free queue. Returns (N, reserved, taken)."""
    mgr = build(v, 64)
    hasher = v["kcu"].get_request_block_hasher(B, v["sha256"])
    mk = lambda rid, n: v["Request"](request_id=rid, prompt_token_ids=list(range(1000, 1000 + n)),  # noqa: E731
                                     sampling_params=v["SamplingParams"](max_tokens=1), pooling_params=None,
                                     block_hasher=hasher)
    a = mk("A", 2 * B)
    _call(mgr.allocate_slots, a, 2 * B)
    a.num_computed_tokens = 2 * B
    if not keep_running:
        mgr.free(a)
    mgr.new_step_starts()  # Mamba refuses hits on blocks cached in the same step
    c, p = mk("C2", 7 * B), 7 * B
    hit, n = mgr.get_computed_blocks(c)[:2]
    m = 2 * B
    new = p - n - m
    reserved = _call(mgr.coordinator.get_num_blocks_to_allocate,
                     request_id=c.request_id, num_tokens=p, new_computed_blocks=hit.blocks,
                     num_encoder_tokens=0, total_computed_tokens=n + m, num_local_computed_tokens=n,
                     num_tokens_main_model=p, prefill_end=p)
    free = mgr.block_pool.get_num_free_blocks()
    _call(mgr.allocate_slots, c, new, num_new_computed_tokens=n, new_computed_blocks=hit,
          num_external_computed_tokens=m, full_sequence_must_fit=True, has_scheduled_reqs=False)
    return n, reserved, free - mgr.block_pool.get_num_free_blocks()


def async_control(v):
    """The same hit loaded asynchronously (what the connector does with sync loads off):
    step 1 adopts the M tokens with num_new_tokens = 0, step 2 computes the rest.
    Returns [(reserved, taken), (reserved, taken)]: equal on every release."""
    mgr = build(v, 64)
    req = request(v)
    empty = mgr.empty_kv_cache_blocks
    out = []
    for new, ext, comp in ((0, M, N), (NEW, 0, N + M)):
        req.num_computed_tokens = comp
        reserved = _call(mgr.coordinator.get_num_blocks_to_allocate,
            request_id=req.request_id, num_tokens=comp + ext + new, new_computed_blocks=empty.blocks,
            num_encoder_tokens=0, total_computed_tokens=comp + ext, num_local_computed_tokens=comp,
            num_tokens_main_model=comp + ext + new, prefill_end=P)
        free = mgr.block_pool.get_num_free_blocks()
        _call(mgr.allocate_slots, req, new, num_new_computed_tokens=0, new_computed_blocks=empty,
                           num_external_computed_tokens=ext, delay_cache_blocks=(new == 0),
                           full_sequence_must_fit=False, has_scheduled_reqs=False)
        out.append((reserved, free - mgr.block_pool.get_num_free_blocks()))
    return out


def _spec(v, kind, b, c):
    group = {"kind": kind, "tokens_per_block": b, "sliding_window": c.get("w"),
             "extra_retained_tokens": c.get("extra"), "attention_chunk_size": c.get("chunk")}
    more = {"num_speculative_blocks": c.get("S", 0)} if kind == "mamba" else {}
    return v["adapter"].kv_cache_spec(group, **more)


def _build_groups(v, specs, b, num_blocks):
    cfg = v["adapter"].kv_cache_config(specs, num_blocks, layer_names=["l%d" % i for i in range(len(specs))])
    for field, val in (("hash_block_size", b), ("cache_hit_alignment_tokens", b)):
        if hasattr(cfg, field):
            setattr(cfg, field, val)
    return v["KVCacheManager"](cfg, max_model_len=1 << 20, scheduler_block_size=b, hash_block_size=b,
                               enable_caching=True)


class _Meter:
    """Per manager: the step call's reservation, and the blocks that leave the free queue in its
    three allocation methods (measured on the real block pool, one method at a time)."""

    def __init__(self, mgr):
        self.pool = mgr.block_pool
        self.reserved, self.taken = {}, {}
        for gi, m in enumerate(mgr.coordinator.single_type_managers):
            self._wrap(gi, m)

    def _wrap(self, gi, m):
        orig = m.get_num_blocks_to_allocate

        def reserve(*a, **k):
            n = orig(*a, **k)
            if not k.get("apply_admission_cap", False):
                self.reserved[gi] = n
            return n

        m.get_num_blocks_to_allocate = reserve
        for name in ("add_local_computed_blocks", "allocate_external_computed_blocks", "allocate_new_blocks"):
            f = getattr(m, name)

            def counted(*a, _f=f, **k):
                before = self.pool.get_num_free_blocks()
                try:
                    return _f(*a, **k)
                finally:
                    self.taken[gi] = self.taken.get(gi, 0) + before - self.pool.get_num_free_blocks()

            setattr(m, name, counted)

    def start(self):
        self.reserved, self.taken = {}, {}

    def result(self, n):
        return [{"reserved": self.reserved.get(gi), "taken": self.taken.get(gi, 0)} for gi in range(n)]


def _checkpoint(m, rid):
    if hasattr(m, "_checkpoints"):
        return rid in m._checkpoints
    return bool(getattr(m, "_num_checkpoint_blocks", {}).get(rid, 0))


def replay_call(v, c):
    """One call spec on the real manager: the first call and the running call, per group."""
    b = c["b"]
    kinds = ["full_attention"] + ([c["kind"]] if c["kind"] != "full_attention" else [])
    mgr = _build_groups(v, [_spec(v, k, b, c) for k in kinds], b, c.get("num_blocks", 4096))
    hasher = v["kcu"].get_request_block_hasher(b, v["sha256"])
    mk = lambda rid, n: v["Request"](request_id=rid, prompt_token_ids=list(range(1000, 1000 + n)),  # noqa: E731
                                     sampling_params=v["SamplingParams"](max_tokens=8), pooling_params=None,
                                     block_hasher=hasher)
    P = c["L"] + c["E"] + c["NEW"] + c.get("NEW2", 1) + b
    if c["L"]:
        a = mk("A", c["L"])
        _call(mgr.allocate_slots, a, c["L"], has_scheduled_reqs=False)
        a.num_computed_tokens = c["L"]
        if c.get("owner_freed"):
            mgr.free(a)
    mgr.new_step_starts()
    req = mk("C", P)
    hit, L = mgr.get_computed_blocks(req)[:2]
    if not c["L"]:
        hit, L = mgr.empty_kv_cache_blocks, 0
    mgr_kind = mgr.coordinator.single_type_managers[-1]
    T = L + c["E"]
    ev = []  # per group: evictable hit blocks (Mamba: its whole hit; else the hit past the skipped blocks)
    for k, m, blocks in zip(kinds, mgr.coordinator.single_type_managers, hit.blocks):
        skip = max(m.get_num_skipped_tokens(T), 0) // b
        ev.append(sum(bl.ref_cnt == 0 and not bl.is_null for bl in (blocks if k == "mamba" else blocks[skip:])))
    meter = _Meter(mgr)
    n = len(kinds)
    out = {"spec": c, "kinds": kinds, "L": L, "ev": ev, "error": None}
    try:
        meter.start()
        got = _call(mgr.allocate_slots, req, c["NEW"], num_new_computed_tokens=L, new_computed_blocks=hit,
                    num_lookahead_tokens=c.get("LA", 0), num_external_computed_tokens=c["E"],
                    delay_cache_blocks=c["NEW"] == 0, has_scheduled_reqs=False)
        out["first"] = meter.result(n)
        out["first_admitted"] = got is not None
        out["c1"] = _checkpoint(mgr_kind, req.request_id)
        req.num_computed_tokens = T + c["NEW"]
        meter.start()
        got = _call(mgr.allocate_slots, req, c.get("NEW2", 1), num_lookahead_tokens=c.get("LA2", 0),
                    has_scheduled_reqs=False)
        out["running"] = meter.result(n)
        out["running_admitted"] = got is not None
        out["c2"] = _checkpoint(mgr_kind, req.request_id)
    except (ValueError, AssertionError) as e:
        out["error"] = "%s: %s" % (type(e).__name__, e)
    return out


def replay_calls(v, path):
    """Each spec replayed; one with ``"plant_fix": true`` runs with the fix planted (then removed)."""
    with open(path) as f:
        specs = json.load(f)
    out = []
    for c in specs:
        unplant = plant_fix(v) if c.get("plant_fix") else None
        try:
            out.append(replay_call(v, c))
        finally:
            if unplant:
                unplant()
    return out


def draw(tables):
    """kvbound's block-table style: [H] hashed (local hit), [·] null, [F] fresh (at/after
    the first fresh block f = cdiv(N, b)); the load region and where each Mamba block
    came from are marked underneath."""
    f = _cdiv(N, B)
    k = _cdiv(N + M, B)  # end of the load region
    lines = []
    for name, row in zip(("group 0 full_attention", "group 1 mamba(align)"), tables):
        cells = "".join("[·]" if b is None else "[H]" if i < f else "[F]" for i, b in enumerate(row))
        lines.append("  %-24s %s" % (name, cells))
    pad = " " * 27
    lines.append(pad + "   " * f + "^ f = cdiv(N=%d, b=%d) = %d" % (N, B, f))
    lines.append(pad + "   " * f + "L" * (3 * (k - f)) + " load region [f, cdiv(N+M, b) = %d)" % k)
    last = len(tables[1]) - 1
    lines.append(pad + "mamba: idx %d from allocate_external_computed_blocks (loaded state), "
                 "idx %d from allocate_new_blocks (running state)" % (k - 1, last))
    return "\n".join(lines)


def main():
    global B, P, M, NEW
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plant-fix", action="store_true")
    ap.add_argument("--calls", metavar="FILE", help="replay these allocate_slots call specs (JSON list) instead")
    ap.add_argument("--block-size", type=int, default=B,
                    help="tokens_per_block of both groups (default 64; e.g. 528, a Mamba2-sized page); "
                         "the prompt scales with it: P = 5 b, M = b, N = 0")
    args = ap.parse_args()
    if args.block_size != B:
        B, P, M = args.block_size, 5 * args.block_size, args.block_size
        NEW = P - N - M
    v = _imports()
    import vllm

    if args.plant_fix:
        plant_fix(v)
    if args.calls:
        print(json.dumps({"vllm": getattr(vllm, "__version__", "?"), "planted_fix": args.plant_fix,
                          "calls": replay_calls(v, args.calls)}))
        return 0
    roomy = one_pass(v, 64)
    tight = one_pass(v, None)
    ctrl = async_control(v)
    local = {"running": local_hit_pass(v, True), "evictable": local_hit_pass(v, False)}
    res = dict(vllm=getattr(vllm, "__version__", "?"), planted_fix=args.plant_fix, async_control=ctrl,
               local_hit=local,
               P=P, N=N, M=M, new=NEW, block_size=B, roomy=roomy, tight=tight,
               over_allocation=roomy["taken"] - roomy["reserved"])
    if args.json:
        print(json.dumps(res))
        return 0
    print("vllm %s  FA(%d) + Mamba(%d, align), one request: P=%d N=%d M=%d (sync load) new=%d"
          % (res["vllm"], B, B, P, N, M, NEW))
    print("pass 1 (roomy pool): reserved %d (per group %s), taken %d  -> over by %d"
          % (roomy["reserved"], roomy["reserved_per_group"], roomy["taken"], res["over_allocation"]))
    print(draw(roomy["tables"]))
    print("control, same hit loaded async (step 1: adopt M, step 2: compute new): "
          "reserved/taken %d/%d, %d/%d" % (ctrl[0] + ctrl[1]))
    for kind, (n, r, t) in local.items():
        print("with a local hit (N=%d, M=%d, prompt %d), the hit's owner %s: reserved %d, taken %d"
              % (n, 2 * B, 7 * B, "still running" if kind == "running" else "freed (blocks evictable)", r, t))
    print("pass 2 (pool with exactly %d free): %s" % (tight["free_before"], tight["error"] or tight["result"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
