"""The witnesses refuted obligations draw, one kind per subject, and their JSON.

A refutation's witness is what the claim is about, concrete: a load (a spec ``Case``, the load
plan's properties), a pair of ``allocate_slots`` calls (``allocator.AllocCalls``, reservation),
a lookup case and its release (``LookupWitness``, the lookup window), one request at a
``_build_store_jobs`` call (``StoreWitness``, the store), one scheduler step (``CopyWitness``, the
copy contract). ``witness_to_dict`` and
``witness_from_dict`` carry any of them through a file (``kvbound prove --json``, the report)
or a worker process (the runner); a non-load kind names itself in the ``"witness"`` field.
Every non-load kind has ``name``, ``draw()``, ``replayed_on``, ``replay_hint`` and ``to_dict()``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvbound.spec import Case, case_from_dict, case_to_dict
from kvbound.spec.lookup import lookup_for_version
from kvbound.spec.lookup_case import LookupCase, lookup_case_from_dict, lookup_case_to_dict

from .allocator import AllocCalls


@dataclass(frozen=True)
class LookupWitness:
    """A refuted lookup obligation's witness: a lookup case and the release it is about."""

    case: LookupCase
    release: str

    replayed_on = "the spec"  # what replays it (the release's lookup spec and the contract)

    @property
    def name(self) -> str:
        return self.case.name

    def draw(self) -> str:
        g = self.case.groups[1]
        row = " ".join({"HIT": "H", "HIT_PENDING": "P", "RETRY": "R", "MISS": "."}[self.case.tier[f"1:{c}"][0].value]
                       for c in range(g.num_keys))
        got = lookup_for_version(self.case, self.release)
        return (f"case {self.case.name}: a window of {g.window} chunks over {g.num_keys} keys"
                f" (H hit, P pending, R retry, . miss; scanned right to left)\n  window group  {row}\n"
                f"  vLLM {self.release}: {'deferred' if got.hit is None else f'hit {got.hit} tokens'}")

    @property
    def replay_hint(self) -> str:
        return (f"`kvbound conform --vllm {self.release} FILE` on its lookup case replays it on the real"
                f" get_num_new_matched_tokens of {self.release}")

    def to_dict(self) -> dict:
        return {"witness": "lookup", "release": self.release, **lookup_case_to_dict(self.case)}

    @classmethod
    def from_dict(cls, d: dict) -> "LookupWitness":
        return cls(lookup_case_from_dict(d), d["release"])


@dataclass(frozen=True)
class StoreWitness:
    """A refuted store obligation's witness: one request at one ``_build_store_jobs`` call of a
    release (the first of its run of ``proofs.store.STORE_SPANS``), and the chunks it stores."""

    name: str
    release: str  # the row's first release
    status: str
    offload_prompt_only: bool
    P: int
    O: int
    T: int
    C: int
    S: int
    A: int
    B: int
    computed: int
    stored_chunks: int
    Ph: int = 0  # num_output_placeholders
    K: int = 0  # draft tokens scheduled
    L: int = 0  # lookahead slots
    is_async: bool = False
    N0: int = 0  # next_stored_chunk_idx before the call

    replayed_on = "the spec"  # what replays it (spec/store.py)

    def draw(self) -> str:
        """As a reviewer reads it: the last stored block's slots, computed or not."""
        start = (self.stored_chunks - 1) * self.B
        slots = "".join("c" if p < self.computed else "." for p in range(start, start + self.B))
        return (f"case {self.name}: vLLM {self.release} {self.status} request, "
                f"offload_prompt_only={self.offload_prompt_only}\n"
                f"  P={self.P} T={self.T} C={self.C} S={self.S} A={self.A} B={self.B} Ph={self.Ph} K={self.K} "
                f"L={self.L} N0={self.N0} ({'async' if self.is_async else 'sync'} scheduler)\n"
                f"  stored chunk {self.stored_chunks - 1} = tokens [{start}, {start + self.B}) under the hash of its prefix\n"
                f"  block slots |{slots}|  (c = KV computed, . = never forwarded, or not since a preemption)")

    @property
    def replay_hint(self) -> str:
        return ("`kvbound trace` on a `*-store-all` layout judges the real release's stores by the same spec "
                "(tests/test_shadow.py replays the 0.27 – 0.29 finished witness on the real 0.29.0)")

    def to_dict(self) -> dict:
        return {"witness": "store", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "StoreWitness":
        return cls(**{k: v for k, v in d.items() if k != "witness"})


@dataclass(frozen=True)
class CopyWitness:
    """A refuted copy obligation's witness: one scheduler step (``proofs.copy``), the holder ``E``
    computed before it and the requests scheduled in it in order, each as a dict (``T``, ``c``,
    ``s``, ``h``, ``new``, ``K0``, ``src``), and every pair's common token prefix ``(a, b, n)``."""

    name: str
    release: str
    B: int
    U: int
    requests: tuple
    lcp: tuple

    replayed_on = "the step model"  # tests/test_copy.py replays it on the real 0.33.0 KVCacheManager

    def glyphs(self, q: dict) -> list[str]:
        """A request's blocks as the step leaves them at its scheduling."""
        B, h, c = self.B, q["h"], q["c"]
        end = c if q["name"] == "E" else (h if q["new"] else c) + q["s"]
        out = []
        for i in range(-(-end // B)):
            if q["name"] == "E" or (not q["new"] and i * B < c):
                out.append("[c]")
            elif q["new"] and i < h // B:
                out.append("[H]")
            elif q["new"] and i == h // B and h % B:
                out.append("[C]")
            else:
                out.append("[F]")
        return out

    def copies(self) -> list[str]:
        by = {q["name"]: q for q in self.requests}
        out = []
        for q in self.requests:
            if not q["new"] or not q["h"] % self.B:
                continue
            j, src = q["h"] // self.B, by[q["src"]]
            kind = self.glyphs(src)[j] if j < len(self.glyphs(src)) else "?"
            why = {"[F]": "allocated in this step: zeroed, its forward has not run",
                   "[C]": "itself a copy destination of this step: the copies run at once, it holds zeros",
                   "[c]": "computed before the step"}.get(kind, kind)
            out.append(f"  {q['name']} idx {j} [C] = copy of {src['name']}'s block {j} ({kind}: {why}): tokens "
                       f"[{j * self.B}, {q['h']}), {src['name']} had computed {src['c']} before the step")
        return out

    def draw(self) -> str:
        """The step's tables, a column per block index: a glyph and two spaces."""
        lines = [f"case {self.name}: vLLM {self.release}, one step, full-attention group, block {self.B} tokens, "
                 f"hash unit {self.U}",
                 "  legend [c] computed before the step  [H] hit (shared)  [C] private copy of a partial hit  "
                 "[F] allocated this step (zeroed; the forward writes it)"]
        width = max(len(self.glyphs(q)) for q in self.requests)
        lines.append("  " + " " * 15 + "idx " + "".join(f"{i:<5}" for i in range(width)).rstrip())
        for q in self.requests:
            role = "before step" if q["name"] == "E" else ("new" if q["new"] else "running")
            info = (f"T={q['T']} c={q['c']}" if q["name"] == "E" else
                    f"T={q['T']} c={q['c']} hit={q['h']} sched={q['s']}")
            lines.append(f"  {q['name']:<3}{role:<11}     " + "".join(f"{g}  " for g in self.glyphs(q)).ljust(width * 5)
                         + info)
        common = ", ".join(f"{a}~{b} {n}" for a, b, n in self.lcp if n)
        lines.append(f"  common prefixes: {common or 'none'}")
        return "\n".join(lines + self.copies())

    @property
    def replay_hint(self) -> str:
        return ("tests/test_copy.py replays it on the real KVCacheManager of 0.33.0 "
                "(scripts/repro_copy_step.py FILE: the holder and the running requests computed in earlier "
                "steps, then the step's requests scheduled in order)")

    def to_dict(self) -> dict:
        return {"witness": "copy", "name": self.name, "release": self.release, "B": self.B, "U": self.U,
                "requests": [dict(q) for q in self.requests], "lcp": [list(x) for x in self.lcp]}

    @classmethod
    def from_dict(cls, d: dict) -> "CopyWitness":
        return cls(d["name"], d["release"], d["B"], d["U"], tuple(dict(q) for q in d["requests"]),
                   tuple(tuple(x) for x in d["lcp"]))


WITNESS_KINDS = {"allocate_slots": AllocCalls, "lookup": LookupWitness, "store": StoreWitness,
                 "copy": CopyWitness}  # the "witness" field -> its kind


def witness_to_dict(w) -> dict:
    """A witness of any kind as JSON: a load as a case file, another kind with its ``"witness"`` field."""
    return case_to_dict(w) if isinstance(w, Case) else w.to_dict()


def witness_from_dict(d: dict):
    """The witness ``witness_to_dict`` wrote (a case file when it names no kind)."""
    kind = d.get("witness")
    return case_from_dict(d) if kind is None else WITNESS_KINDS[kind].from_dict(d)


__all__ = ["WITNESS_KINDS", "CopyWitness", "LookupWitness", "StoreWitness", "witness_from_dict", "witness_to_dict"]
