"""Judging one real result against the spec: which assert fired, which fields differ.

Pure functions over JSON, so they are tested without vLLM. The real side is the
worker's line (``side/conform_worker.py``); the spec side is ``LoadPlan.to_json`` (the fields
``kvbound plan`` prints), so both speak the same field names.
"""

from __future__ import annotations

import re

from kvbound.spec import (
    LOAD_FIELDS, PLAN_FIELDS, Case, GroupKind, Variant, plan_for_version, release_features,
    variant_for_version,
)
from kvbound.spec.strategies import ADVERSARIAL_FAMILIES, V2_FAMILIES
from kvbound.spec.asserts import ASSERTS
from kvbound.spec.verdicts import Verdict

# The fields ``kvbound plan`` prints, compared one by one.

# Asserts of update_state_after_alloc, recognised by their source statement, across
# the field renames (0.20-0.24 gpu_block_size/block_size_factor; 0.26+
# tokens_per_block/blocks_per_chunk).  Order matters: first match names it.
_ASSERT_PATTERNS = tuple((row.name, re.compile(row.source)) for row in ASSERTS)  # spec/asserts.py
TARGET_FUNCTION = "update_state_after_alloc"


def classify_assert(site: dict | None) -> str:
    """``table_length`` ... ``keys_length`` for the function under study, else
    ``other:<file>:<line>: <statement>`` so an unexpected assert is never hidden."""
    if not site:
        return "other:unknown"
    stmt = " ".join((site.get("statement") or "").split())
    if site.get("function") == TARGET_FUNCTION:
        for name, pat in _ASSERT_PATTERNS:
            if pat.match(stmt):
                return name.value
    where = f"{_short_path(site.get('file'))}:{site.get('line')}"
    return f"other:{where} in {site.get('function')}: {stmt or '?'}"


def _short_path(path: str | None) -> str:
    if not path:
        return "?"
    i = path.rfind("vllm/")
    return path[i:] if i >= 0 else path


def real_plan_json(result: dict) -> dict:
    """The worker's result in ``kvbound plan``'s shape (assertion named, keys as pairs)."""
    outcome = result.get("outcome")
    out = {"name": result.get("name"), "outcome": outcome, "assertion": None,
           "dst_block_ids": [], "group_sizes": [], "block_indices": [], "keys": []}
    if outcome == "ok":
        for f in LOAD_FIELDS:
            out[f] = list(result.get(f) or [])
    elif outcome == "unsupported":
        out["reason"] = result.get("why")
    elif outcome == "assertion_error":
        out["assertion"] = classify_assert(result.get("assert_site"))
    elif outcome == "exception":
        out["assertion"] = None
        out["error"] = result.get("error")
    return out


def diff_fields(real: dict, spec: dict, case: Case | None = None) -> list[str]:
    """The ``kvbound plan`` fields on which the two sides differ; with the case, keys
    that name the same offload key (``same_keys``) are equal."""
    out = []
    for f in PLAN_FIELDS:
        if f == "keys" and case is not None:
            if not same_keys(case, real.get(f) or [], spec.get(f) or []):
                out.append(f)
        elif _norm(real.get(f)) != _norm(spec.get(f)):
            out.append(f)
    return out


def canonical_key(case: Case, key: list) -> list:
    """A boundary key ``[g, "boundary", t]`` with ``t`` a whole number of group ``g``'s
    chunks IS chunk ``t // tokens_per_chunk - 1``'s key: both are the hash of the first
    ``t`` tokens (0.33.0 offloading/scheduler.py:1154-1158 keys a partial tail at
    boundary + margin; an EAGLE group's proof position often lands on a chunk edge)."""
    if len(key) == 3 and key[1] == "boundary":
        tpc = case.groups[key[0]].config.tokens_per_chunk(case.blocks_per_chunk)
        if key[2] % tpc == 0:
            return [key[0], key[2] // tpc - 1]
    return list(key)


def same_keys(case: Case, real: list, spec: list) -> bool:
    """Whether two prepare_load key lists name the same offload keys, in order."""
    return len(real) == len(spec) and all(
        canonical_key(case, a) == canonical_key(case, b) for a, b in zip(real, spec))


def _norm(v):
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    return v


# Verdicts of one (release, case) pair (kvbound.spec.verdicts.CONFORM_VERDICTS).
AGREE, DISAGREE, FAULT, UNDRIVEN, UNSUPPORTED = (
    Verdict.AGREE, Verdict.DISAGREE, Verdict.FAULT, Verdict.UNDRIVEN, Verdict.UNSUPPORTED)


def judge(case: Case, release: str, result: dict) -> dict:
    """The per-case record of the report: both outputs, the verdict, and why."""
    variant = variant_for_version(release)
    spec_plan = plan_for_version(case, release)  # its scan and its release's asserts
    spec = spec_plan.to_json(case.name)
    rec = {"name": case.name, "release": release, "variant": variant.value, "spec": spec,
           "lookup": result.get("lookup"), "sync_load_marked": result.get("sync_load_marked"),
           "partial_tail_boundary": result.get("partial_tail_boundary")}
    if spec_plan.assertion is not None:
        rec["spec_assertion_group"] = spec_plan.assertion.group_index
    outcome = result.get("outcome")
    if outcome == "assertion_error" and result.get("phase") == "setup":
        site = result.get("assert_site") or {}
        rec.update(verdict=UNSUPPORTED, real=real_plan_json(dict(result, name=case.name)),
                   why="the release refuses this configuration while the connector is built"
                       f" ({_short_path(site.get('file'))}:{site.get('line')} in {site.get('function')}:"
                       f" {site.get('statement')}); a server with it would not start, so there is no"
                       " load plan to compare")
        return rec
    if outcome in ("worker_crash", "worker_timeout") or (
        outcome == "exception" and result.get("phase") == "setup"
    ):
        rec.update(verdict=FAULT, real=result, fault=_fault_text(result))
        return rec
    real = real_plan_json(dict(result, name=case.name))
    rec["real"] = real
    site = result.get("assert_site")
    if site:
        rec["real_assert_site"] = {k: site.get(k) for k in ("file", "line", "function", "statement", "group_index")}
    lookup_m = (result.get("lookup") or {}).get("num_external_tokens")
    rec["lookup_matches_case"] = lookup_m == case.num_external_tokens
    if (variant is Variant.FIXED_SYNC and case.sync_load and case.num_external_tokens
            and result.get("sync_load_marked") is False):
        rec.update(verdict=UNDRIVEN,
                   why="vLLM's lookup did not reserve a sync load for this request (it needs a"
                       " non-zero hit with N + hit < num_tokens); the positional match"
                       " was not exercised, so the case is not judged")
        return rec
    if (result.get("phase") in ("update_state_after_alloc", "done")
            and result.get("partial_tail_boundary") != case.partial_tail_boundary):
        rec.update(verdict=UNDRIVEN, why=_tail_undriven(case, result))
        return rec
    return _judged(rec, diff_fields(real, spec, case), config_mismatches(case, release, result.get("real_config")))


def _judged(rec: dict, diff: list[str], config_mismatch: dict) -> dict:
    """``rec`` closed on the fields that differ: a config mismatch is one more ("config");
    the verdict is DISAGREE on any difference, else AGREE."""
    if config_mismatch:
        rec["config_mismatch"] = config_mismatch
        diff.append("config")
    rec["diff"] = diff
    rec["verdict"] = DISAGREE if diff else AGREE
    return rec


def spec_config(case: Case, release: str) -> dict:
    """What the spec derives of the connector's config for ``case`` on ``release``, in
    the worker's ``real_config`` shape: supports_partial_tail (None before 0.28), each
    offloaded group's window in chunks, and the EAGLE proof margins."""
    feats = release_features(release)
    bpc = case.blocks_per_chunk
    tails = feats.partial_tails and case.partial_tail_refusal(
        eagle_groups_allowed=feats.eagle_partial_tails) is None
    return {
        "supports_partial_tail": tails if feats.partial_tails else None,
        "window_in_chunks": [case.groups[gi].config.sliding_window_size_in_chunks(
            bpc, feats.window_counts_retained) for gi in case.offloaded_group_indices],
        "eagle_proof_margins": {str(gi): case.eagle_proof_margin(gi) for gi in case.offloaded_group_indices
                                if feats.eagle_partial_tails and case.eagle_proof_margin(gi)},
    }


def config_mismatches(case: Case, release: str, real_config: dict | None) -> dict:
    """{field: {"real", "spec"}} where vLLM's own derivation differs from the spec's."""
    if not real_config:
        return {}
    spec = spec_config(case, release)
    return {k: {"real": real_config.get(k), "spec": v} for k, v in spec.items()
            if real_config.get(k) is not None or k == "supports_partial_tail"
            if real_config.get(k) != v}


def _tail_undriven(case: Case, result: dict) -> str:
    """Why vLLM's lookup did not record the case's partial tail (or recorded one the case lacks)."""
    got = result.get("partial_tail_boundary")
    lookup_m = (result.get("lookup") or {}).get("num_external_tokens")
    N, want = case.num_locally_computed_tokens, case.partial_tail_boundary
    if want is None:
        return (f"vLLM's lookup recorded a partial tail at {got} tokens the case does not have (the fake"
                " tier answers MISS for every boundary key but the case's), so the case is not judged")
    if got is None:
        return (f"vLLM's lookup recorded no partial tail though the tier holds the case's boundary key at"
                f" {want}: it answered M={lookup_m} from N={N} (complete chunks only). The boundary is searched"
                " only in the block after the complete-chunk hit (two blocks with an EAGLE group, 0.33) and"
                " below num_prompt_tokens, so the case's M and boundary are not what the lookup can pick;"
                " the case is not judged")
    return (f"vLLM's lookup recorded a partial tail at {got}, not the case's {want}; the case is not judged")


def _fault_text(result: dict) -> str:
    o = result.get("outcome")
    if o == "worker_crash":
        return ("the worker process died on this case (exit code %s); the run went on with a fresh"
                " worker. Its stderr ends:\n%s" % (result.get("exit_code"), result.get("stderr_tail", "")))
    if o == "worker_timeout":
        return "the worker gave no answer within %s s; it was killed and restarted" % result.get("timeout_s")
    return ("kvbound's adapter could not build vLLM's objects for this case (%s); this is an adapter"
            " or release-API problem, not a verdict on the scheduler" % result.get("error"))


# --- families (the matrix rows) ------------------------------------------------

_KIND_PRIORITY = (GroupKind.MAMBA, GroupKind.SLIDING_WINDOW, GroupKind.CHUNKED_LOCAL)


def row_of(case: Case, origin: str, family: str) -> str:
    """``realistic/<kind>`` (the most special kind the hybrid holds: mamba > sliding
    window > chunked local > full attention only), ``recurrent_state``, ``pr_case``,
    ``adversarial``, ``example`` or ``witness``."""
    if origin == "witness":
        return "witness"
    if origin == "file" and (case.name.startswith("pr-") or case.name == "pr_case"):
        return "pr_case"
    if family == "realistic":
        kinds = {g.config.kind for g in case.groups}
        for k in _KIND_PRIORITY:
            if k in kinds:
                return f"realistic/{k.value}"
        return "realistic/full_attention"
    return family


ROW_ORDER = ("realistic/full_attention", "realistic/sliding_window", "realistic/chunked_local",
             "realistic/mamba", "recurrent_state",
             *(f for f in V2_FAMILIES if f not in ADVERSARIAL_FAMILIES), "pr_case", "example", "witness",
             *ADVERSARIAL_FAMILIES)


def outcome_label(rec: dict) -> str:
    """The real outcome in one word: ok, an assert name, exception, or the fault."""
    real = rec.get("real") or {}
    if rec["verdict"] == FAULT:
        return (rec.get("real") or {}).get("outcome", "fault")
    if rec["verdict"] == UNSUPPORTED:
        return "refused-config"
    if real.get("outcome") == "ok":
        return "ok"
    if real.get("outcome") == "assertion_error":
        a = real.get("assertion") or "other"
        return "other-assert" if a.startswith("other") else a
    return real.get("outcome") or "?"


def is_blocking(rec: dict, row: str) -> bool:
    """What fails CI: a disagreement, fault or undriven case outside the adversarial row
    (a non-adversarial case the real lookup cannot be made to drive is a generator or
    adapter bug, not a pass)."""
    return row not in ADVERSARIAL_FAMILIES and rec["verdict"] in (DISAGREE, FAULT, UNDRIVEN)


def matrix(records: list[dict], releases: list[str]) -> dict:
    """{row: {release: {"total", "agree", "disagree", "fault", "undriven", "outcomes": {..}}}}"""
    m: dict = {}
    for rec in records:
        cell = m.setdefault(rec["row"], {}).setdefault(rec["release"], {
            "total": 0, AGREE: 0, DISAGREE: 0, FAULT: 0, UNDRIVEN: 0, UNSUPPORTED: 0, "outcomes": {}})
        cell["total"] += 1
        cell[rec["verdict"]] += 1
        lab = outcome_label(rec)
        cell["outcomes"][lab] = cell["outcomes"].get(lab, 0) + 1
    return m


def render_matrix(m: dict, releases: list[str]) -> str:
    """Rows = case families, one column per release: agree/total, then the real outcomes."""
    rows = [r for r in ROW_ORDER if r in m] + sorted(r for r in m if r not in ROW_ORDER)
    heads = [f"vllm {r} ({variant_for_version(r).value})" for r in releases]
    cells = []
    for row in rows:
        line = []
        for rel in releases:
            c = m[row].get(rel)
            if not c:
                line.append("-")
                continue
            s = f"{c[AGREE]}/{c['total']} agree"
            for k in (DISAGREE, FAULT, UNDRIVEN, UNSUPPORTED):
                if c[k]:
                    s += f", {c[k]} {k}"
            outs = " ".join(f"{k}:{v}" for k, v in sorted(c["outcomes"].items(), key=lambda kv: (kv[0] != "ok", kv[0])))
            line.append(f"{s} | {outs}")
        cells.append(line)
    w0 = max([len("family")] + [len(r) for r in rows])
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    out = ["  ".join([f"{'family':<{w0}}"] + [f"{h:<{w}}" for h, w in zip(heads, widths)]).rstrip()]
    out.append("  ".join(["-" * w0] + ["-" * w for w in widths]))
    for row, line in zip(rows, cells):
        out.append("  ".join([f"{row:<{w0}}"] + [f"{c:<{w}}" for c, w in zip(line, widths)]).rstrip())
    return "\n".join(out)



# --- lookup cases (spec/lookup.py; docs/case-format.md, "Lookup cases") -------------------

def judge_lookup(case, release: str, result: dict) -> dict:
    """A lookup case's record: the real ``get_num_new_matched_tokens`` against the spec of
    ``release`` on the case as the release configured it (its own group order, Mamba
    alignment, partial-tail block and EAGLE margins, read back from the built scheduler;
    the windows must be the case's, else a config mismatch)."""
    from dataclasses import replace

    from kvbound.spec.lookup import get_num_new_matched_tokens

    feats = release_features(release)
    rec = {"name": case.name, "release": release, "variant": feats.variant.value}
    outcome = result.get("outcome")
    if outcome == "unsupported":
        rec.update(verdict=UNSUPPORTED, why=result.get("why"), real={"outcome": "unsupported"},
                   spec={"outcome": "unsupported"})
        return rec
    if outcome == "undriven":
        rec.update(verdict=UNDRIVEN, why=result.get("why"), real={"outcome": "undriven"}, spec={})
        return rec
    if outcome != "ok":
        rec.update(verdict=FAULT, real=result, fault=_fault_text(result), spec={})
        return rec
    rc = result.get("real_config") or {}
    mismatch = {}
    if rc.get("windows") is not None and [g.window for g in case.groups] != rc["windows"]:
        mismatch["windows"] = {"case": [g.window for g in case.groups], "real": rc["windows"]}
    if rc.get("tokens_per_chunk") and [g.tokens_per_chunk for g in case.groups] != rc["tokens_per_chunk"]:
        mismatch["tokens_per_chunk"] = {"case": [g.tokens_per_chunk for g in case.groups],
                                        "real": rc["tokens_per_chunk"]}
    as_built = replace(case, lookup_groups=tuple(rc.get("lookup_groups") or case.lookup_groups),
                       mamba_align_size=rc.get("mamba_align_size"),
                       partial_tail_block_size=int(rc.get("partial_tail_block_size") or 0),
                       eagle_proof_margins={int(k): int(v) for k, v in (rc.get("eagle_proof_margins") or {}).items()})
    spec = get_num_new_matched_tokens(as_built, feats)
    real = {"outcome": "ok", "hit": result.get("hit"), "partial_tail_boundary": result.get("partial_tail_boundary"),
            "queries": result.get("queries")}
    rec.update(real=real, spec=spec.to_json())
    if spec.unsupported:
        rec.update(verdict=UNSUPPORTED, why=spec.unsupported)
        return rec
    diff = [f for f in ("hit", "partial_tail_boundary", "queries") if real[f] != rec["spec"][f]]
    return _judged(rec, diff, mismatch)
