"""Spec mutants: one planted fault in the executable spec each, applied at runtime.

A mutant names one function of ``kvbound.spec`` and one exact piece of its source
text to replace. Applying it compiles the changed source in the function's own
module and swaps the function's ``__code__`` in place, so every caller (whoever
imported the name) runs the mutant; reverting swaps the original back. No source
file is edited. A mutant whose text is no longer in the function is an error
(``MutantError``), never a silent survivor: the table must follow the spec.

``kvbound conform --spec-mutants`` judges the same real vLLM results once per
mutant (vLLM runs once); a mutant is killed when at least one (case, release)
pair that agrees with the spec disagrees with the mutant. The names follow the
mutant classes of issue 11 (asserts: order, window slack, alignment; the sync rule;
the keys slice; the partial-tail rule; group iteration), one definition here.
"""

from __future__ import annotations

import __future__
import inspect
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from types import FunctionType

from kvbound.errors import KvboundError


class MutantError(KvboundError, RuntimeError):
    """A mutant that cannot be applied to the current spec (its text is gone): exit 2."""


@dataclass(frozen=True)
class SpecMutant:
    name: str
    what: str  # the planted fault in words
    target: str  # "module:qualname" of a function (a property's getter: "module:Class.prop")
    old: str  # exact source text in that function
    new: str  # its replacement


_PLAN = "kvbound.spec.plan"
_VOCAB = "kvbound.spec.vocab"

SPEC_MUTANTS: tuple[SpecMutant, ...] = (
    SpecMutant(
        "assert-order", "the window bound is checked before the alignment assert (fixed variants)",
        f"{_PLAN}:plan_load",
        "        if asserts and variant is not Variant.LEGACY and N % b != 0:",
        "        if asserts and variant is not Variant.LEGACY and N % b != 0 and not (\n"
        "            cfg.sliding_window_size_in_chunks(bpc, release.window_counts_retained) is not None\n"
        "            and release.window_slack is not None and k - start > cfg.sliding_window_size_in_chunks(\n"
        "                bpc, release.window_counts_retained) * bpc + release.window_slack):",
    ),
    SpecMutant(
        "window-slack", "the window bound loses its + 1 (pending <= window * bpc)",
        f"{_PLAN}:plan_load",
        "        slack = release.window_slack\n",
        "        slack = release.window_slack and release.window_slack - 1\n",
    ),
    SpecMutant(
        "window-retained", "the window in chunks ignores extra_retained_tokens (0.31+ count them)",
        f"{_VOCAB}:GroupConfig.sliding_window_size_in_chunks",
        "            if count_retained and self.extra_retained_tokens:",
        "            if False:",
    ),
    SpecMutant(
        "alignment-dropped", "the fixed variants' alignment assert N % b == 0 is gone",
        f"{_PLAN}:plan_load",
        "        if asserts and variant is not Variant.LEGACY and N % b != 0:",
        "        if False:",
    ),
    SpecMutant(
        "boundary-dropped", "the legacy boundary assert N <= start * b is gone",
        f"{_PLAN}:plan_load",
        "        if asserts and variant is Variant.LEGACY and not N <= start * b:",
        "        if False:",
    ),
    SpecMutant(
        "sync-rule", "a 0.33 sync load no longer matches hashed blocks by position",
        f"{_PLAN}:variant_load_start",
        "match_hashed=variant is Variant.FIXED_SYNC and sync_load,",
        "match_hashed=False,",
    ),
    SpecMutant(
        "scan-nulls", "the scan stops at the null block too (no null skip)",
        f"{_PLAN}:load_start_gpu_block_idx",
        "    wanted = (BlockState.UNHASHED, BlockState.HASHED) if match_hashed else (BlockState.UNHASHED,)",
        "    wanted = (BlockState.UNHASHED, BlockState.HASHED, BlockState.NULL) if match_hashed else"
        " (BlockState.UNHASHED, BlockState.NULL)",
    ),
    SpecMutant(
        "scan-from-zero", "the fixed variants scan from 0 as legacy did",
        f"{_PLAN}:scan_from",
        "    return cdiv(num_locally_computed_tokens, tokens_per_block)",
        "    return 0",
    ),
    SpecMutant(
        "keys-slice-start", "keys start at cdiv(start, bpc) instead of start // bpc",
        f"{_PLAN}:plan_load",
        "        start_chunk = end_chunk = start // bpc",
        "        start_chunk = end_chunk = cdiv(start, bpc)",
    ),
    SpecMutant(
        "keys-slice-end", "keys end at T // tpc instead of cdiv(T, tpc)",
        f"{_PLAN}:plan_load",
        "        num_chunks = cdiv(T, tpc)",
        "        num_chunks = T // tpc",
    ),
    SpecMutant(
        "keys-prompt-only", "offload keys counted from the prompt, not from all num_tokens",
        f"{_VOCAB}:Case.num_offload_keys",
        "return (self.num_tokens // self.tokens_per_hash) // hashes_per_chunk",
        "return (self.num_prompt_tokens // self.tokens_per_hash) // hashes_per_chunk",
    ),
    SpecMutant(
        "partial-tail-chunk", "a partial tail also loads its boundary's chunk as a chunk key",
        f"{_PLAN}:plan_load",
        "        end_chunk_idx = num_chunks - tail",
        "        end_chunk_idx = num_chunks",
    ),
    SpecMutant(
        "partial-tail-margin", "a partial tail's key ignores the EAGLE proof margin",
        f"{_PLAN}:partial_tail_key_tokens",
        "    return case.partial_tail_boundary + margin",
        "    return case.partial_tail_boundary",
    ),
    SpecMutant(
        "partial-tail-assert", "the request-level partial_tail assert (boundary == T) is gone",
        f"{_PLAN}:plan_load",
        "    if asserts and tail and boundary != T:",
        "    if False:",
    ),
    SpecMutant(
        "group-iteration", "groups iterated by position, not by their group_idx (non-offloaded groups)",
        f"{_PLAN}:plan_load",
        "    for gi in case.offloaded_group_indices:",
        "    for gi in range(len(case.offloaded_group_indices)):",
    ),
)

BY_NAME = {m.name: m for m in SPEC_MUTANTS}


def _resolve(target: str):
    import importlib

    mod_name, qual = target.split(":")
    mod = importlib.import_module(mod_name)
    obj = mod
    for part in qual.split("."):
        obj = getattr(obj, part) if not isinstance(obj, type) else obj.__dict__[part]
    if isinstance(obj, property):
        obj = obj.fget
    if not isinstance(obj, FunctionType):
        raise MutantError(f"{target} is not a function")
    return mod, obj


def mutated_code(mutant: SpecMutant):
    """(the function, its mutated code object)."""
    mod, fn = _resolve(mutant.target)
    src = inspect.getsource(fn)  # as in the file: ``old`` keeps the file's indentation
    n = src.count(mutant.old)
    if n != 1:
        raise MutantError(
            f"spec mutant {mutant.name!r}: the text to replace occurs {n} times in {mutant.target}"
            f" (expected once); update kvbound/conform/mutants.py to the spec:\n  {mutant.old.strip()}")
    src = textwrap.dedent(src.replace(mutant.old, mutant.new))
    lines = src.splitlines(keepends=True)
    while lines and lines[0].lstrip().startswith("@"):  # a property's decorator
        lines.pop(0)
    ns: dict = {}
    code = compile("".join(lines), f"<spec mutant {mutant.name}: {mutant.target}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, mod.__dict__, ns)
    (new_fn,) = [v for v in ns.values() if isinstance(v, FunctionType)]
    if new_fn.__code__.co_freevars != fn.__code__.co_freevars:
        raise MutantError(f"spec mutant {mutant.name!r}: {mutant.target} has closure variables")
    return fn, new_fn.__code__


@contextmanager
def applied(name: str):
    """Run the block with spec mutant ``name`` planted; the original comes back after."""
    if name not in BY_NAME:
        raise MutantError(f"unknown spec mutant {name!r}; known: {', '.join(BY_NAME)}")
    fn, code = mutated_code(BY_NAME[name])
    original = fn.__code__
    fn.__code__ = code
    try:
        yield BY_NAME[name]
    finally:
        fn.__code__ = original


def score(jobs, judge_one) -> dict:
    """Each spec mutant against the same real results.

    ``jobs``: (case, release, raw worker result, verdict without a mutant);
    ``judge_one(case, release, result)`` -> record. A mutant is killed by the first
    pair that agreed without it and does not with it (or whose spec side raises).
    Returns {"killed", "total", "score", "mutants": {name: {"killed_by", "release",
    "what", "diff"}}, "survivors": [names]}.
    """
    out = {}
    agreeing = [j for j in jobs if j[3] == "agree"]
    for m in SPEC_MUTANTS:
        killer = None
        with applied(m.name):
            for case, release, result, _ in agreeing:
                try:
                    rec = judge_one(case, release, result)
                except Exception as e:  # noqa: BLE001 - a crashing mutant spec is killed too
                    killer = {"killed_by": case.name, "release": release,
                              "diff": [f"spec raised {type(e).__name__}: {e}"]}
                    break
                if rec["verdict"] != "agree":
                    killer = {"killed_by": case.name, "release": release,
                              "diff": rec.get("diff") or [rec["verdict"]]}
                    break
        out[m.name] = dict(killer or {"killed_by": None}, what=m.what)
    killed = sum(v["killed_by"] is not None for v in out.values())
    return {"killed": killed, "total": len(out), "score": round(killed / len(out), 4) if out else None,
            "mutants": out, "survivors": [n for n, v in out.items() if v["killed_by"] is None]}
