"""Shadow KV: what the real KV cache would hold, per block, and the read check on it.

Shadow KV's first part, the content model. Part of the side package (standard library
only; vLLM's objects come in as arguments). The other two parts are the tier's transfers
(``tier.py``) and the store contract (``store_contract.py``); ``shadow.py`` wires the three
to one engine. The content model (docs/trace.md, "Shadow KV"):

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
  reading request's own identity at that position, else ``data:wrong_kv``.

The CPU tier and the transfers between it and these blocks are ``tier.py``'s; what a store
may copy is ``store_contract.py``'s.
"""

from .fakes import out_tok

UNWRITTEN = "unwritten"


def chain(prev, tok):
    """The prefix identity after ``tok``, given the identity before it (ints hash the same
    in every process: no PYTHONHASHSEED dependence)."""
    return hash((prev, tok)) & 0xFFFFFFFFFFFF


def describe(slot):
    if slot is None:
        return UNWRITTEN
    g, ident, rid, p = slot
    return "group %d KV of request %s position %d (identity %012x)" % (g, rid, p, ident)


class Report:
    """The shadow's findings, each once: appended to ``violations`` at the step ``step()``
    names."""

    def __init__(self, violations, step):
        self.violations, self.step = violations, step
        self.reported = set()  # (check, request, group, block, position): once each

    def violate(self, check, rid, g, bid, p, msg, **extra):
        # once per (check, request, group, block): a wrong block reads wrong at every position
        tag = (check, rid, g, bid) if check == "data:wrong_kv" else (check, rid, g, bid, p)
        if tag in self.reported:
            return
        self.reported.add(tag)
        if callable(extra.get("table")):
            extra["table"] = extra["table"]()
        self.violations.append(dict({"check": check, "step": self.step(), "request": rid,
                                         "group": g, "block_id": bid, "position": p, "message": msg},
                                        **extra))


class ContentModel:
    """What each GPU block holds, slot by slot, as the forward writes it and the model runner
    zeroes and copies it; and the read check before every forward. ``managers``: the
    KV-cache manager's single-type managers (their ``req_to_blocks``, ``block_size``,
    ``get_num_skipped_tokens``); ``kinds``: each group's kind; ``sched``: where the running
    requests are (``sched.requests``); ``guard(block, what, offset)``: called before a block
    is rewritten (the store contract's fence)."""

    def __init__(self, managers, kinds, sched, report, stats, guard=None):
        self.managers, self.kinds, self.sched, self.report, self.stats = list(managers), kinds, sched, report, stats
        self.block_size = [m.block_size for m in self.managers]
        # Mamba groups in mamba_cache_mode "all": the forward also writes the state at every block end
        # it crosses (0.29.0 v1/kv_cache_interface.py:884-887: one state block per block of tokens)
        self.all_states = {g for g, m in enumerate(self.managers)
                           if getattr(getattr(m, "kv_cache_spec", None), "mamba_cache_mode", None) == "all"}
        self.guard = guard or (lambda bid, what, off=0: None)
        self.gpu = {}  # GPU block id -> [slot] (None: unwritten)
        self.gpu_via = {}  # GPU block id -> how its content last arrived, when not computed in place
        self.chains = {}  # request id -> prefix identities of its real tokens so far
        self.seen_requests = {}  # request id -> Request (kept for the after-drain check)
        self.ver = {}  # GPU block id -> version, bumped when a slot someone verified changes
        self.checked_hi = {}  # GPU block id -> slots [0, hi) verified at this version (by anyone)
        self.verified = {}  # request -> {(group, block index) -> (block id, version, lo, hi) read clean
        stats.update(shadow_reads=0, shadow_writes=0, shadow_relaid=0)  # relaid: a page rewritten in another block size

    def token(self, req, p):
        """The real token at position ``p`` of ``req`` (prompt, or the fake model's sample)."""
        n = req.num_prompt_tokens
        if p < n:
            return req.prompt_token_ids[p]
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

    def update_states(self, so):
        """The model runner's ``_update_states`` (0.33.0 gpu_model_runner.py:1205-1211, 0.29.0
        :1229-1238): zero the newly allocated blocks, then apply the scheduler's block copies
        all at once: ``copy_kv_cache_blocks_inplace`` gathers every source, then scatters
        (0.33.0 v1/worker/utils.py:909-955, ``blocks[dst] = blocks[src]``), so a copy whose
        source is itself a destination of the step's copies carries that source's content
        before the copies (zeroed, if it was allocated in this step)."""
        for bid in getattr(so, "new_block_ids_to_zero", None) or ():
            self.write_block(int(bid), None, "zeroed")
        copies = getattr(so, "kv_cache_block_copies", None) or ()
        sources = [self.gpu.get(cp.src_block_id) for cp in copies]  # gathered before any write
        dsts = {cp.dst_block_id for cp in copies}
        for cp, src in zip(copies, sources):
            chained = " (itself a destination of this step's copies)" if cp.src_block_id in dsts else ""
            self.write_block(cp.dst_block_id, None if src is None else list(src),
                             "copied from block %d%s" % (cp.src_block_id, chained))

    def bump(self, bid):
        self.ver[bid] = self.ver.get(bid, 0) + 1
        self.checked_hi.pop(bid, None)

    def slots(self, bid, g):
        """Block ``bid``'s slots as group ``g`` lays them out, or None when nothing is written
        there in ``g``'s layout. The groups draw their blocks from one pool of equal pages (0.28.0
        v1/core/kv_cache_coordinator.py:97, one BlockPool for every group), so a page a sliding
        window wrote as 16-token blocks and freed may be reallocated to full attention's
        64-token blocks (DeepSeek V4's shape, layouts ``swa-mixed``): laid out in another block
        size, its bytes hold nothing of this group's KV."""
        content = self.gpu.get(bid)
        return content if content is not None and len(content) == self.block_size[g] else None

    def write_block(self, bid, content, via):
        self.guard(bid, via)
        self.bump(bid)
        if content is None:
            self.gpu.pop(bid, None)
        else:
            self.gpu[bid] = content
        if via is None:
            self.gpu_via.pop(bid, None)
        else:
            self.gpu_via[bid] = via

    def forward(self, so):
        """Read check, then the writes of one step's forward."""
        sched = self.sched
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
                    content = self.slots(bid, g)
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
        self.report.violate("data:wrong_kv", req.request_id, g, bid, p,
                     "request %s reads group %d position %d from block %s: expected its own prefix"
                     " (identity %012x), found %s%s"
                     % (req.request_id, g, p, bid, want, describe(got),
                        "" if not via else " (content arrived: %s)" % via),
                     expected=want, found=None if got is None else list(got), provenance=via,
                     table=lambda: block_table(self, req, g, p))

    def write(self, req, start, end, drafts):
        nt = end - len(drafts)  # where the drafts start
        for g, kind in enumerate(self.kinds):
            if kind == "mamba":
                # the state after the step's last token; under spec decode also after each
                # verified position (the runner keeps one state per draft, so the accepted
                # one is there whichever it is)
                last = end - 1 - len(drafts)
                B = self.block_size[g]
                ends = range(start + (B - 1 - start) % B, last, B) if g in self.all_states else ()
                for p in (*ends, *range(max(start, last), end)):
                    bid, off = self.slot_of(g, req, p)
                    if bid:
                        content = self.slots(bid, g)
                        if content is None or p == last or p in ends:
                            self.guard(bid, "by the forward of request %s" % req.request_id)
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
                    self.guard(bid, "by the forward of request %s" % req.request_id, off)
                    last = bid
                content = self.slots(bid, g)
                if content is None:
                    if bid in self.gpu:  # laid out in another group's block size
                        self.bump(bid)
                        self.gpu_via.pop(bid, None)
                        self.stats["shadow_relaid"] += 1
                    content = self.gpu[bid] = [None] * self.block_size[g]
                if off < self.checked_hi.get(bid, 0):
                    self.bump(bid)
                content[off] = (g, self.draft_ident(req, p, nt, drafts), req.request_id, p)
                self.stats["shadow_writes"] += 1

    def write_external(self, req, block_ids, start, end, via):
        """Another connector's load wrote tokens [start, end) of ``req`` into ``block_ids`` (per
        group, the request's table when the load was set up): the KV its prefix has there, as a
        prefill node computed it (a Mamba group: the state after the last token)."""
        for g, kind in enumerate(self.kinds):
            ids, B = block_ids[g], self.block_size[g]
            for p in ([end - 1] if kind == "mamba" else range(start, end)):
                bid = ids[p // B] if p // B < len(ids) else 0
                if not bid:
                    continue
                if p == start or p % B == 0 or kind == "mamba":  # a block's first write: its fence
                    if kind == "mamba" or self.slots(bid, g) is None:
                        self.write_block(bid, [None] * B, via)
                    else:
                        self.guard(bid, via, p % B)
                        self.bump(bid)
                        self.gpu_via[bid] = via
                self.gpu[bid][p % B] = (g, self.ident(req, p), req.request_id, p)

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


def block_table(model, req, g, p):
    """``model``'s (a ``ContentModel``) block table of ``req`` in group ``g`` up to position ``p``'s block (three blocks
    before it), each block's slots as runs: [what, first position, last + 1, writer, writer's
    first position] with what = own (this prefix's KV), foreign, unwritten."""
    B = model.block_size[g]
    blocks = model.managers[g].req_to_blocks.get(req.request_id, ())
    fi = p // B
    rows = []
    for i in range(max(0, fi - 3), min(len(blocks), fi + 1)):
        bid = 0 if blocks[i].is_null else blocks[i].block_id
        runs = []
        content = model.slots(bid, g) if bid else None
        for off in range(B):
            q = i * B + off
            got = content[off] if content is not None else None
            if got is None:
                key = ["unwritten", None, None]
            elif got[0] == g and got[1] == model.ident(req, q):
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
                     "via": model.gpu_via.get(bid)})
    return {"group": g, "request": req.request_id, "block_size": B, "position": p, "rows": rows}
