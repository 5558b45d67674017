"""Spec mutants: the mutants of ``kvbound.proofs.mutants.MUTANTS`` (the one table of
names, for the encoding, the spec and the impl) planted in the executable spec.

Each patch names one function of ``kvbound.spec`` and one exact piece of its source
text to replace. Applying it compiles the changed source in the function's own
module and swaps the function's ``__code__`` in place, so every caller (whoever
imported the name) runs the mutant; reverting swaps the original back. No source
file is edited. A patch whose text is no longer in the function is an error
(``MutantError``), never a silent survivor: the patches must follow the spec, and a
mutant of the table the spec can express must have one (tests/test_conform.py).

``kvbound conform --spec-mutants`` judges the same real vLLM results once per
mutant (vLLM runs once); a mutant is killed when at least one (case, release) pair
that agrees with the spec disagrees with the mutant.
"""

from __future__ import annotations

import __future__
import inspect
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from types import FunctionType

from kvbound.errors import MutantError
from kvbound.proofs import mutants


@dataclass(frozen=True)
class SpecMutant:
    name: str  # a name of kvbound.proofs.mutants.MUTANTS
    target: str  # "module:qualname" of a function (a property's getter: "module:Class.prop")
    old: str  # exact source text in that function, as indented in the file
    new: str  # its replacement

    @property
    def what(self) -> str:
        return mutants.BY_NAME[self.name].what if self.name in mutants.BY_NAME else "?"


_PLAN = "kvbound.spec.plan"
_VOCAB = "kvbound.spec.vocab"
_CASE = "kvbound.spec.case"
_LOOP = "    for i in range(scan_from, num_gpu_blocks):"
_ALIGN = "        if asserts and variant is not Variant.LEGACY and N % b != 0:"

SPEC_MUTANTS: tuple[SpecMutant, ...] = (
    # the scan
    SpecMutant("scan-from-zero", f"{_PLAN}:scan_from",
               "    return cdiv(num_locally_computed_tokens, tokens_per_block)", "    return 0"),
    SpecMutant("scan-nulls", f"{_PLAN}:load_start_gpu_block_idx",
               "    wanted = (BlockState.UNHASHED, BlockState.HASHED) if match_hashed else (BlockState.UNHASHED,)",
               "    wanted = (BlockState.UNHASHED, BlockState.HASHED, BlockState.NULL) if match_hashed else"
               " (BlockState.UNHASHED, BlockState.NULL)"),
    SpecMutant("floor-f", f"{_PLAN}:scan_from",
               "    return cdiv(num_locally_computed_tokens, tokens_per_block)",
               "    return num_locally_computed_tokens // tokens_per_block"),
    SpecMutant("unhashed-test-dropped", f"{_PLAN}:load_start_gpu_block_idx",
               "    wanted = (BlockState.UNHASHED, BlockState.HASHED) if match_hashed else (BlockState.UNHASHED,)",
               "    wanted = (BlockState.UNHASHED, BlockState.HASHED)"),
    SpecMutant("start-equals-f", f"{_PLAN}:variant_load_start",
               "    return load_start_gpu_block_idx(", "    return scan_from(variant, N, b)\n    return dict("),
    SpecMutant("loop-from-f+1", f"{_PLAN}:load_start_gpu_block_idx", _LOOP,
               "    for i in range(scan_from + 1, num_gpu_blocks):"),
    SpecMutant("loop-from-f-1", f"{_PLAN}:load_start_gpu_block_idx", _LOOP,
               "    for i in range(scan_from - 1, num_gpu_blocks):"),
    SpecMutant("loop-to-k-1", f"{_PLAN}:load_start_gpu_block_idx", _LOOP,
               "    for i in range(scan_from, num_gpu_blocks - 1):"),
    SpecMutant("loop-to-k+1", f"{_PLAN}:load_start_gpu_block_idx", _LOOP,
               "    for i in range(scan_from, num_gpu_blocks + 1):"),
    # the asserts
    SpecMutant("assert-order", f"{_PLAN}:plan_load", _ALIGN,
               _ALIGN[:-1] + " and not (\n"
               "            cfg.sliding_window_size_in_chunks(bpc, release.window_counts_retained) is not None\n"
               "            and release.window_slack is not None and k - start > cfg.sliding_window_size_in_chunks(\n"
               "                bpc, release.window_counts_retained) * bpc + release.window_slack):"),
    SpecMutant("window-slack", f"{_PLAN}:plan_load",
               "        slack = release.window_slack\n",
               "        slack = release.window_slack and release.window_slack - 1\n"),
    SpecMutant("window-retained", f"{_VOCAB}:GroupConfig.sliding_window_size_in_chunks",
               "            if count_retained and self.extra_retained_tokens:", "            if False:"),
    SpecMutant("alignment-dropped", f"{_PLAN}:plan_load", _ALIGN, "        if False:"),
    SpecMutant("boundary-dropped", f"{_PLAN}:plan_load",
               "        if asserts and variant is Variant.LEGACY and not N <= start * b:", "        if False:"),
    # the sync rule
    SpecMutant("sync-rule", f"{_PLAN}:variant_load_start",
               "match_hashed=variant is Variant.FIXED_SYNC and sync_load,", "match_hashed=False,"),
    # the keys slice and the group size
    SpecMutant("keys-slice-start", f"{_PLAN}:plan_load",
               "        start_chunk = end_chunk = start // bpc", "        start_chunk = end_chunk = cdiv(start, bpc)"),
    SpecMutant("keys-from-start//bpc+1", f"{_PLAN}:plan_load",
               "        start_chunk = end_chunk = start // bpc", "        start_chunk = end_chunk = start // bpc + 1"),
    SpecMutant("keys-slice-end", f"{_PLAN}:plan_load",
               "        num_chunks = cdiv(T, tpc)", "        num_chunks = T // tpc"),
    SpecMutant("keys-prompt-only", f"{_CASE}:Case.num_offload_keys",
               "return (self.num_tokens // self.tokens_per_hash) // hashes_per_chunk",
               "return (self.num_prompt_tokens // self.tokens_per_hash) // hashes_per_chunk"),
    SpecMutant("pending+1", f"{_PLAN}:plan_load", "        pending = k - start\n", "        pending = k - start + 1\n"),
    SpecMutant("pending-1", f"{_PLAN}:plan_load", "        pending = k - start\n", "        pending = k - start - 1\n"),
    # partial tails
    SpecMutant("partial-tail-chunk", f"{_PLAN}:plan_load",
               "        end_chunk_idx = num_chunks - tail", "        end_chunk_idx = num_chunks"),
    SpecMutant("partial-tail-margin", f"{_PLAN}:partial_tail_key_tokens",
               "    return case.partial_tail_boundary + margin", "    return case.partial_tail_boundary"),
    SpecMutant("partial-tail-assert", f"{_PLAN}:plan_load",
               "    if asserts and tail and boundary != T:", "    if False:"),
    # group iteration
    SpecMutant("group-iteration", f"{_PLAN}:plan_load",
               "    for gi in case.offloaded_group_indices:",
               "    for gi in range(len(case.offloaded_group_indices)):"),
)

BY_NAME = {m.name: m for m in SPEC_MUTANTS}

# Survivors that no real run can kill, and why (issue 11: "each survivor explained").
SPEC_EQUIVALENT = {
    "floor-f": "equivalent while vLLM's asserts are on: cdiv(N, b) and N // b differ only for an unaligned N,"
               " and there the fixed variants' alignment assert fires right after the scan whatever it found"
               " (legacy scans from 0 either way); only `python -O` would see it, and real vLLM runs with asserts",
}


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
    """Each spec mutant against the same real results, scored in the catalogue's JSON
    (``kvbound.proofs.mutants.score("spec", ...)``) plus, per mutant, the pair that killed
    it and the fields that differed, and each survivor's equivalence note if it has one.

    ``jobs``: (case, release, raw worker result, verdict without a mutant);
    ``judge_one(case, release, result)`` -> record. A mutant is killed by the first
    pair that agreed without it and does not with it (or whose spec side raises).
    """
    killers, details = {}, {}
    agreeing = [j for j in jobs if j[3] == "agree"]
    for m in SPEC_MUTANTS:
        killer = None
        with applied(m.name):
            for case, release, result, _ in agreeing:
                try:
                    rec = judge_one(case, release, result)
                except Exception as e:  # noqa: BLE001 - a crashing mutant spec is killed too
                    killer = {"case": case.name, "release": release,
                              "diff": [f"spec raised {type(e).__name__}: {e}"]}
                    break
                if rec["verdict"] != "agree":
                    killer = {"case": case.name, "release": release, "diff": rec.get("diff") or [rec["verdict"]]}
                    break
        killers[m.name] = None if killer is None else f"{killer['case']} on vllm {killer['release']}"
        details[m.name] = dict(killer or {}, what=m.what)
    out = mutants.score("spec", killers)
    out["details"] = details
    out["equivalent"] = {n: SPEC_EQUIVALENT[n] for n in out["survivors"] if n in SPEC_EQUIVALENT}
    out["unexplained_survivors"] = [n for n in out["survivors"] if n not in SPEC_EQUIVALENT]
    return out


def missing_patches() -> list[str]:
    """Mutants of the catalogue the spec can express but no patch here plants."""
    return [m.name for m in mutants.applicable("spec") if m.name not in BY_NAME]
