"""The findings table: every kind of finding the trace reports, one row each.

A kind is named ``<class>:<what>``. Its class says what went wrong (``CLASSES``); its
effect says whether something wrong was read, served or crashed (safety) or only work
was lost (efficiency: the engine recomputes what it could have loaded); its shape names
the detail fields that tell two defects of one kind apart, so a campaign counts them as
two findings and a shrink keeps the one it started from. Add a kind here, and every
emitter (the worker's checks, the host's judges) may report it; a kind not in the table
is refused (``row``).

Standard library only: the side package loads this file by path in the release's venv,
and the host imports it as ``kvbound.side.findings``.
"""

from __future__ import annotations

from dataclasses import dataclass

# The classes, in the order a campaign counts them (its ``by_class``).
CLASSES = ("crash", "plan", "data", "store", "lookup", "liveness", "lifecycle", "premise", "harness")
SAFETY, EFFICIENCY = "safety", "efficiency"


@dataclass(frozen=True)
class Shape:
    """The detail fields that make a finding's shape, and how they read as text.

    ``text(detail, groups)`` is the shape (None: this finding has none) where ``groups``
    are the layout's groups of the segment it ran on; ``key_format`` puts kind and shape
    together into the finding's key; ``file_text`` is the part of the shape a trace
    file's name carries."""

    fields: tuple
    key_format: str
    text: object  # (detail, groups) -> str | None
    file_text: object = None  # (detail, groups) -> str | None; None: the shape's text

    def key(self, kind: str, detail: dict, groups) -> str:
        shape = self.text(detail, groups)
        return self.key_format.format(kind=kind, shape=shape) if shape is not None else kind

    def file_part(self, detail: dict, groups) -> str | None:
        return (self.file_text or self.text)(detail, groups)


def _site(d, groups):
    site = d.get("assert_site") or {}
    return f"{site.get('function')}:{site.get('statement') or d.get('error')}"


def _site_function(d, groups):
    return str((d.get("assert_site") or {}).get("function") or "")


def _deferral(d, groups):
    # "<group kind> <answer> <key>" each (lookup_checks.deferral_causes): the key dropped
    if not d.get("deferred_on"):
        return None
    return "deferred on " + ", ".join(sorted({" ".join(c.split()[:2]) for c in d["deferred_on"]}))


def _read(d, groups):
    if not isinstance(d.get("group"), int):
        return None
    kind = groups[d["group"]]["kind"] if d["group"] < len(groups) else "?"
    via = d.get("provenance") or ""
    found = ("the null block" if via == "the null block" else "unwritten") if d.get("found") is None \
        else "another prefix"
    return f"{kind}: {found}" + (", arrived by a load" if via.startswith("load job") else "")


def _event_view(d, groups):
    if not d.get("view"):
        return None
    return "%s: %s" % (d.get("medium"), d["view"]) + (", dropped by a reset" if d.get("left_by") == "reset" else "")


# An exception's site: the function and the statement (or, without one, the error).
SITE = Shape(("assert_site", "error"), "{kind}@{shape}", _site, _site_function)
def _owed_why(d, groups):
    return ", ".join(d["why"]) if d.get("why") else None


# Why the chunks a request-level tier missed were owed to it (side/request_tier.py).
OWED = Shape(("why",), "{kind}[{shape}]", _owed_why)
# The call a secondary tier got after a request's finish, and the tier (side/tier_lifecycle.py).
TIER_CALL = Shape(("call", "tier"), "{kind}[{shape}]", lambda d, groups: "%s to %s" % (d.get("call"), d.get("tier")))
# What a failed start or stop of the tiering spec left behind (side/failed_start.py).
WHAT = Shape(("what",), "{kind}[{shape}]", lambda d, groups: d.get("what"))
# The secondary tier a lifecycle finding is about.
TIER = Shape(("tier",), "{kind}[{shape}]", lambda d, groups: d.get("tier"))
# The group kind and answer of each key a needless deferral hangs on.
DEFERRAL = Shape(("deferred_on",), "{kind}[{shape}]", _deferral)
# The group kind a wrong read is in, what it found there, and whether a load brought it.
READ = Shape(("group", "found", "provenance"), "{kind}[{shape}]", _read)
# The medium of a KV-event view that disagrees with its tier, which way (stale or missing), and
# whether the stale blocks were dropped by a connector reset.
EVENT_VIEW = Shape(("medium", "view", "left_by"), "{kind}[{shape}]", _event_view)


@dataclass(frozen=True)
class FindingKind:
    kind: str  # "<class>:<what>"; a family's row: "<class>:" (premise: any premise id)
    doc: str
    effect: str = SAFETY
    shape: Shape | None = None

    def __post_init__(self):
        if self.finding_class not in CLASSES or self.effect not in (SAFETY, EFFICIENCY):
            raise ValueError(f"finding kind {self.kind!r}: class or effect not in the table's")

    @property
    def finding_class(self) -> str:
        return self.kind.split(":", 1)[0]

    @property
    def safety(self) -> bool:
        return self.effect == SAFETY

    def key(self, kind: str, detail: dict, groups=()) -> str:
        return self.shape.key(kind, detail, groups) if self.shape else kind


_ROWS = (
    FindingKind("crash:exception", "vLLM raised while stepping the engine (an assert or an error inside"
                " vLLM's own code)", shape=SITE),
    FindingKind("crash:engine_build", "vLLM's own validation refused to build the engine for a layout the"
                " release table says it supports", shape=SITE),
    FindingKind("plan:spec_disagreement", "an update_state_after_alloc call whose load plan differs from the"
                " release's spec (conform.compare.judge)"),
    FindingKind("data:wrong_kv", "before a forward, a slot the model reads holds another prefix's KV, or"
                " none", shape=READ),
    FindingKind("data:load_past_unfilled_group", "a load made tokens computed that a group the connector does not"
                " offload holds no KV for (its block under them is no cache hit, and nothing fills it): the model"
                " reads none there (side/checks.py check_load_bound)"),
    FindingKind("data:copy_of_uncomputed_tokens", "a block copy (kv_cache_block_copies) carries tokens no"
                " holder of the source had computed before the step"),
    FindingKind("store:spec_disagreement", "a _build_store_jobs call advanced next_stored_chunk_idx where"
                " the store spec (spec/store.py) does not"),
    FindingKind("store:unwritten_source", "a store copies a slot that was never computed"),
    FindingKind("store:foreign_source", "a store copies a slot holding another request's prefix"),
    FindingKind("store:torn_file_kept", "the file-system tier reported a promotion whose read came up short"
                " and kept the short file: its lookup goes on answering the key held and each promotion of it"
                " fails (side/tier_faults.py, engine setting tier_torn_p)", EFFICIENCY),
    FindingKind("store:wrong_key", "a store's CPU key is not the chunk hash of the block it copies"),
    FindingKind("store:null_source", "a store reads the null block"),
    FindingKind("store:source_rewritten", "a block is rewritten while a store not yet copied reads it"),
    FindingKind("store:stale_event", "after the connector's KV events are taken, a consumer that applied them"
                " in order lists a block the offload tier does not hold (stale) or misses one it holds"
                " (missing)", EFFICIENCY, EVENT_VIEW),
    FindingKind("store:backpressure_bypassed", "a store reached a secondary tier whose backpressure detector"
                " refused it, or one it allowed never reached the tier", EFFICIENCY),
    FindingKind("store:request_tier_incomplete", "a secondary tier that asked for request-level offload was"
                " told a request finished before every chunk the request offered that the primary tier held,"
                " or stored, reached it under that request (side/request_tier.py)", EFFICIENCY, OWED),
    FindingKind("store:lost_chunk", "after drain, a chunk the policy offloads is not in the tier",
                EFFICIENCY),
    FindingKind("lookup:spec_disagreement", "get_num_new_matched_tokens answered other than the release's"
                " lookup spec (spec/lookup.py)"),
    FindingKind("lookup:keys_disagreement", "get_num_new_matched_tokens gave the spec's answer but asked the"
                " tier other keys, or in another order, than the release's lookup spec (spec/lookup.py)"),
    FindingKind("lookup:false_hit", "the lookup claimed tokens the tier does not hold ready"),
    FindingKind("lookup:lost_hit", "the lookup claimed fewer tokens than the tier holds ready", EFFICIENCY),
    FindingKind("lookup:needless_deferral", "the lookup deferred, yet no pending key can make the hit"
                " larger", EFFICIENCY, DEFERRAL),
    FindingKind("liveness:stuck_request", "a request waits on the tier for more steps than the bound"),
    FindingKind("lifecycle:load_key_not_confirmed", "a key passed to prepare_load was not confirmed by that"
                " request's lookup"),
    FindingKind("lifecycle:allocation_exceeds_reservation", "allocate_slots took more blocks than the"
                " request's reservation"),
    FindingKind("lifecycle:load_into_null_block", "a load's destination is the null block"),
    FindingKind("lifecycle:load_into_foreign_block", "a load's destination is a block another request"
                " holds"),
    FindingKind("lifecycle:blocks_not_freed", "after drain, GPU blocks are not back in the free pool"),
    FindingKind("lifecycle:connector_state_left", "after drain, the connector still holds per-request"
                " state"),
    FindingKind("lifecycle:tier_chunks_pinned", "after drain, chunks of the offload tier are still pinned by a"
                " read no transfer will release"),
    FindingKind("lifecycle:transfer_not_finished", "after drain, transfer jobs are still pending"),
    FindingKind("lifecycle:transfer_stats_mismatch", "after drain, the connector's transfer stats as the"
                " frontend's logger reduces them count other bytes or transfers than the worker was told"
                " finished (what operators read is wrong; no KV is)", EFFICIENCY),
    FindingKind("lifecycle:tier_call_after_finish", "a secondary tier got a job of a request after it was told"
                " the request finished (side/tier_lifecycle.py)", shape=TIER_CALL),
    FindingKind("lifecycle:tier_request_not_finished", "after drain, a secondary tier was never told a request it"
                " saw begin had finished (side/tier_lifecycle.py)", shape=TIER),
    FindingKind("lifecycle:failed_start_unclean", "a secondary tier failed to start and the tiering spec did not"
                " release what it had started (a tier not shut down, its shared region's file left in /dev/shm,"
                " holding the CPU tier's bytes until removed) or replaced the start's error"
                " (side/failed_start.py)", shape=WHAT),
    FindingKind("lifecycle:failed_stop_unclean", "a secondary tier failed to shut down and the tiering manager"
                " did not give every other tier its shutdown (a tier left running, its threads and files with"
                " it) or lost or replaced the failure (side/failed_start.py)", shape=WHAT),
    FindingKind("liveness:no_progress", "the engine scheduled tokens for 1,000 steps and none sampled one: its"
                " requests run and are preempted, or recomputed, without end (side/engine.py PROGRESS_STEPS)"),
    FindingKind("lifecycle:not_drained", "the engine did not finish its requests (no progress, or past the"
                " step bound)"),
    FindingKind("premise:valid-call", "the call vLLM made is no valid case (its block table breaks the case"
                " format's rules)"),
    FindingKind("premise:", "a premise of the proofs (proofs/premises.py, by id: a captured load; "
                "proofs/store_premises.py: a captured _build_store_jobs call) is false on a real call"),
    FindingKind("harness:setup", "kvbound's adapter could not build the engine (never a vLLM finding)",
                shape=SITE),
    FindingKind("harness:exception", "kvbound's own fakes or adapter raised (never a vLLM finding)",
                shape=SITE),
    FindingKind("harness:capture", "kvbound could not capture a connector call (never a vLLM finding)"),
)
KINDS = {r.kind: r for r in _ROWS}
FAMILIES = {r.kind: r for r in _ROWS if r.kind.endswith(":")}


def row(kind: str) -> FindingKind:
    """The table's row for ``kind``; a kind the table lacks is refused (ValueError)."""
    got = KINDS.get(kind)
    if got is None:
        cls, sep, what = kind.partition(":")
        got = FAMILIES.get(cls + ":") if sep and what else None
    if got is None or got.kind == kind in FAMILIES:
        raise ValueError(f"finding kind {kind!r}: not in the findings table (kvbound/side/findings.py)")
    return got
