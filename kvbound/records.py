"""The JSON files kvbound writes and reads, as typed records: one module, both sides.

``kvbound prove --json``, ``kvbound diff --json`` and ``kvbound conform --json`` write a
record's ``to_json()``; ``kvbound report`` reads a file back with the record's
``from_json``, which checks every field it reads and names the first that is missing
or of the wrong type (``prove JSON.obligations[3]: missing field 'verdict'``). A field
the report shows is a field here: add it to the record, and both sides have it.
Verdicts are ``kvbound.spec.verdicts.Verdict`` members; cases stay in the case-file
format (``case_to_dict``) and are read back with ``case_from_dict`` where drawn.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from kvbound.errors import ReportInputError
from kvbound.spec.verdicts import CONFORM_VERDICTS, DIFF_VERDICTS, PROOF_VERDICTS, Verdict

SECONDS_DIGITS = 4  # rounding of the timings a record holds


def need(obj, key: str, where: str, types=None):
    """``obj[key]``, or a ReportInputError naming where the field was expected."""
    if not isinstance(obj, dict):
        raise ReportInputError(f"{where}: expected an object, found {type(obj).__name__}")
    if key not in obj:
        raise ReportInputError(f"{where}: missing field '{key}'")
    v = obj[key]
    if types is not None and not isinstance(v, types):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise ReportInputError(f"{where}.{key}: expected {names}, found {type(v).__name__}")
    return v


def need_verdict(obj, key: str, where: str, allowed) -> Verdict:
    v = need(obj, key, where, str)
    if v not in allowed:
        raise ReportInputError(f"{where}.{key}: {v!r} is not one of {', '.join(allowed)}")
    return Verdict(v)


def _list(obj, key: str, where: str) -> list:
    return need(obj, key, where, list)


def _optional(obj, key: str, where: str, types, default):
    return need(obj, key, where, types) if isinstance(obj, dict) and key in obj else default


_OPT_STR = (str, type(None))
_OPT_DICT = (dict, type(None))
_NUMBER = (int, float)


# --------------------------------------------------------------------------- prove


@dataclass
class ObligationRecord:
    """One obligation's result, as ``kvbound prove --json`` writes it."""

    id: str
    statement: str
    math: str
    premise: str
    expected: Verdict
    verdict: Verdict
    met: bool
    seconds: float
    bound: dict | None  # proofs.obligations.Bound.to_json()
    premises: list  # ids of the premise objects the obligation rests on
    vacuity: str | None  # proved: "premises satisfiable" or why not
    replay_failure: str | None  # refuted: why the spec did not reproduce the witness
    witness: dict | None  # a case file (case_to_dict), or an allocate_slots witness (reservation), for a refutation
    releases: str | None = None  # the vLLM releases it is about (Obligation.release_range)

    @classmethod
    def of(cls, result) -> ObligationRecord:
        """From a ``kvbound.proofs.Result``."""
        from kvbound.proofs.witnesses import witness_to_dict

        o = result.obligation
        return cls(
            id=o.id, statement=o.statement, math=o.math, premise=o.premise, expected=o.expected,
            verdict=result.verdict, met=result.met, seconds=round(result.seconds, SECONDS_DIGITS),
            bound=o.bound.to_json(), premises=list(o.premises), vacuity=result.vacuity or None,
            replay_failure=result.replay, witness=None if result.witness is None else witness_to_dict(result.witness),
            releases=o.release_range or None)

    @classmethod
    def from_json(cls, d, where: str) -> ObligationRecord:
        rec = cls._fields_from_json(d, where)
        if rec.met and rec.verdict != rec.expected:
            raise ReportInputError(f"{where}.met: true, but verdict {rec.verdict} is not the expected {rec.expected}")
        return rec

    @classmethod
    def _fields_from_json(cls, d, where: str) -> ObligationRecord:
        return cls(
            id=need(d, "id", where, str), statement=need(d, "statement", where, str),
            math=need(d, "math", where, str), premise=need(d, "premise", where, str),
            expected=need_verdict(d, "expected", where, PROOF_VERDICTS),
            verdict=need_verdict(d, "verdict", where, PROOF_VERDICTS), met=need(d, "met", where, bool),
            seconds=need(d, "seconds", where, _NUMBER), bound=need(d, "bound", where, _OPT_DICT),
            premises=_list(d, "premises", where), vacuity=need(d, "vacuity", where, _OPT_STR),
            replay_failure=need(d, "replay_failure", where, _OPT_STR), witness=need(d, "witness", where, _OPT_DICT),
            releases=need(d, "releases", where, _OPT_STR) if "releases" in d else None)


@dataclass
class ProveRecord:
    """The file ``kvbound prove --json`` writes."""

    obligations: list[ObligationRecord]
    mutants: dict | None  # mutant -> id of the obligation that killed it (None: survived); None: not run
    mutation_score: dict | None  # proofs.mutants.mutation_score("encoding", ...); None: not run
    total_seconds: float
    ok: bool

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d, where: str = "prove JSON") -> ProveRecord:
        obs = _list(d, "obligations", where)
        return cls(
            obligations=[ObligationRecord.from_json(o, f"{where}.obligations[{i}]") for i, o in enumerate(obs)],
            mutants=need(d, "mutants", where, _OPT_DICT), mutation_score=need(d, "mutation_score", where, _OPT_DICT),
            total_seconds=need(d, "total_seconds", where, _NUMBER), ok=need(d, "ok", where, bool))


# --------------------------------------------------------------------------- diff


@dataclass
class DiffDisagreement:
    """One case where the impl differs from a reference (the spec or the symbolic model)."""

    case: dict  # a case file
    variant: str
    against: str  # "spec" | "symbolic"
    spec: dict | None  # the spec's plan (LoadPlan.to_json); None against the symbolic model
    impl: dict  # the impl's plan
    detail: str

    @classmethod
    def from_json(cls, d, where: str) -> DiffDisagreement:
        return cls(case=need(d, "case", where, dict), variant=need(d, "variant", where, str),
                   against=need(d, "against", where, str), spec=need(d, "spec", where, _OPT_DICT),
                   impl=need(d, "impl", where, dict), detail=need(d, "detail", where, str))


@dataclass
class DiffRecord:
    """The file ``kvbound diff --json`` writes: counts, rates and every disagreement."""

    cases: int
    seed: int
    device: str
    against: list
    families: dict  # family -> group kinds drawn
    variants: dict  # variant -> {checks, outcomes, groups_per_kind, disagreements}
    generator: str  # how the cases were drawn (--generator)
    workers: int  # processes the impl-vs-spec run used
    exhaustive: dict | None  # {scope, cases} when every case of a scope was enumerated
    timings: dict | None  # where the wall time went (impl, spec, conversion...)
    spec_seconds: float
    spec_checks_per_min: int | None
    symbolic: dict  # checked / forced / not_forced / unknown / seconds
    inconclusive: list  # [{case, variant, detail}]
    disagreements: list[DiffDisagreement]
    saved: list  # corpus paths of the shrunk disagreements
    elapsed_s: float
    result: Verdict  # DIFF_VERDICTS: agree, disagree, or unknown (a symbolic check was inconclusive)
    mutants: dict | None = None  # --mutants: the impl mutation score (proofs.mutants.score)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d, where: str = "diff JSON") -> DiffRecord:
        return cls(
            cases=need(d, "cases", where, int), seed=need(d, "seed", where, int),
            device=need(d, "device", where, str), against=_list(d, "against", where),
            families=need(d, "families", where, dict), variants=need(d, "variants", where, dict),
            generator=need(d, "generator", where, str), workers=need(d, "workers", where, int),
            exhaustive=need(d, "exhaustive", where, _OPT_DICT), timings=need(d, "timings", where, _OPT_DICT),
            spec_seconds=need(d, "spec_seconds", where, _NUMBER),
            spec_checks_per_min=need(d, "spec_checks_per_min", where, (int, type(None))),
            symbolic=need(d, "symbolic", where, dict), inconclusive=_list(d, "inconclusive", where),
            disagreements=[DiffDisagreement.from_json(x, f"{where}.disagreements[{i}]")
                           for i, x in enumerate(_list(d, "disagreements", where))],
            saved=_list(d, "saved", where), elapsed_s=need(d, "elapsed_s", where, _NUMBER),
            result=need_verdict(d, "result", where, DIFF_VERDICTS), mutants=_optional(d, "mutants", where, _OPT_DICT, None))


# --------------------------------------------------------------------------- conform


@dataclass
class ConformCase:
    """One (case, release) pair: both outputs, the verdict and why.

    The fields the report and the matrix read are typed; ``compare.judge``'s other
    diagnostics (lookup, why, fault, real_assert_site, ...) ride along in ``extra``."""

    name: str
    release: str
    variant: str
    verdict: Verdict
    row: str  # the matrix row: the case family, pr_case, example or witness
    spec: dict | None = None  # the spec's plan for this release (LoadPlan.to_json)
    real: dict | None = None  # the real release's plan, or the fault
    case: dict | None = None  # the case file
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> ConformCase:
        """From ``compare.judge``'s record (plus origin/family/row/case)."""
        typed = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in d.items() if k in typed},
                   extra={k: v for k, v in d.items() if k not in typed})

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, **d}

    @classmethod
    def from_json(cls, d, where: str) -> ConformCase:
        for key in ("name", "release", "variant", "row"):
            need(d, key, where, str)
        need_verdict(d, "verdict", where, CONFORM_VERDICTS)
        for key in ("spec", "real", "case"):
            if key in d:
                need(d, key, where, _OPT_DICT)
        rec = cls.from_dict(d)
        rec.verdict = Verdict(rec.verdict)
        return rec


@dataclass
class ConformRecord:
    """The file ``kvbound conform --json`` writes."""

    releases: dict  # version -> the worker's hello (python, scheduler_file, ...) and seconds
    not_prepared: list  # releases that could not be prepared or started
    matrix: dict  # compare.matrix: row -> release -> counts
    blocking: int  # non-adversarial disagreements and faults, failed witnesses
    cases: list[ConformCase]
    command: str = ""  # the command line that wrote the file
    undriven_blocking: int = 0  # of the blocking ones, cases the harness could not drive
    spec_mutant: str | None = None  # --spec-mutant: the spec mutant this run applied
    spec_mutation: dict | None = None  # --spec-mutants: the spec mutation score (proofs.mutants.score)

    def to_json(self) -> dict:
        d = asdict(self)
        d["cases"] = [c.to_json() for c in self.cases]
        return d

    @classmethod
    def from_json(cls, d, where: str = "conform JSON") -> ConformRecord:
        return cls(
            releases=need(d, "releases", where, dict), not_prepared=_list(d, "not_prepared", where),
            matrix=need(d, "matrix", where, dict), blocking=need(d, "blocking", where, int),
            cases=[ConformCase.from_json(r, f"{where}.cases[{i}]") for i, r in enumerate(_list(d, "cases", where))],
            # fields newer than some committed files: absent means the default
            command=_optional(d, "command", where, str, ""),
            undriven_blocking=_optional(d, "undriven_blocking", where, int, 0),
            spec_mutant=_optional(d, "spec_mutant", where, _OPT_STR, None),
            spec_mutation=_optional(d, "spec_mutation", where, _OPT_DICT, None))


# --------------------------------------------------------------------------- trace

TRACE_FILE_FORMAT = "kvbound-trace/1"
CAMPAIGN_FORMAT = "kvbound-campaign/1"

# Finding kinds renamed since the first trace files and campaign documents were written
# (the findings table, kvbound/side/findings.py, names every kind "<class>:<what>"):
# mapped where such a file is read, never written.
V1_KINDS = {"vllm-exception": "crash:exception", "spec-disagreement": "plan:spec_disagreement"}


def current_kind(kind: str) -> str:
    return V1_KINDS.get(kind, kind)


def current_key(key: str) -> str:
    """A finding key of an older file in today's names: the kind, then its shape."""
    for old, new in V1_KINDS.items():
        if key == old or key.startswith((old + "@", old + "[")):
            return new + key[len(old):]
    return key


def _format(d, where: str, fmt: str) -> None:
    if need(d, "format", where) != fmt:
        raise ReportInputError(f"{where}.format: must be {fmt!r}")


@dataclass
class TraceFileRecord:
    """A trace file (``kvbound trace`` and ``campaign --out``): one finding with the
    requests that reproduce it (shrunk), the layout and engine they ran on, and the
    captured call; ``kvbound trace --replay`` reads it back."""

    kind: str
    finding_class: str
    safety: bool
    release: str
    layout: str
    detail: dict
    case: dict | None
    segment: dict  # the job: layout, params, requests
    shrunk_from: int | None = None
    shrink_reruns: int | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        return {"format": TRACE_FILE_FORMAT, "kind": self.kind, "class": d.pop("finding_class"), **d}

    @classmethod
    def from_json(cls, d, where: str = "trace file") -> TraceFileRecord:
        _format(d, where, TRACE_FILE_FORMAT)
        return cls(kind=current_kind(need(d, "kind", where, str)), finding_class=_optional(d, "class", where, str, ""),
                   safety=_optional(d, "safety", where, bool, True), release=need(d, "release", where, str),
                   layout=need(d, "layout", where, str), detail=_optional(d, "detail", where, _OPT_DICT, None) or {},
                   case=_optional(d, "case", where, _OPT_DICT, None), segment=need(d, "segment", where, dict),
                   shrunk_from=_optional(d, "shrunk_from", where, (int, type(None)), None),
                   shrink_reruns=_optional(d, "shrink_reruns", where, (int, type(None)), None))


@dataclass
class TraceRecord:
    """The file ``kvbound trace --json`` writes (the same command writes the same bytes)."""

    vllm: str
    seed: int
    requests_per_layout: int
    layouts: list  # per layout: its stats, captured_calls, spec_agree, not_judged, findings
    skipped: list  # [{layout, why}]
    findings: list  # [{kind, class, safety, layout, detail, file}]
    coverage: dict | None = None  # --coverage: relpath -> CampaignRecord's per-file form

    def to_json(self) -> dict:
        d = asdict(self)
        if d["coverage"] is None:
            del d["coverage"]
        return d


@dataclass
class CampaignFinding:
    """One distinct finding of a campaign, with the columns that have it."""

    key: str
    kind: str
    finding_class: str
    safety: bool
    columns: list
    first: str
    last: str
    stops_at: str | None  # the first later column whose run of its layouts was clean
    cells: list  # [column, layout, count, requests after shrinking, file]
    example: dict | None
    # when it was first seen: {"point": "<column>, layout L, seed S, segment I", "requests": the
    # point's requests before that step, "cpu_s": the worker's CPU seconds of that traffic (a
    # measurement, left out by ``reproducible``)}; None in documents older than it
    detect: dict | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("finding_class")
        if d["detect"] is None:
            del d["detect"]
        return d

    @classmethod
    def from_json(cls, d, where: str) -> CampaignFinding:
        return cls(key=current_key(need(d, "key", where, str)), kind=current_kind(need(d, "kind", where, str)),
                   finding_class=need(d, "class", where, str), safety=need(d, "safety", where, bool),
                   columns=_list(d, "columns", where), first=need(d, "first", where, str),
                   last=need(d, "last", where, str), stops_at=need(d, "stops_at", where, _OPT_STR),
                   cells=_list(d, "cells", where), example=need(d, "example", where, _OPT_DICT),
                   detect=_optional(d, "detect", where, _OPT_DICT, None))


@dataclass
class CampaignRecord:
    """The file ``kvbound campaign --json`` writes (deterministic: the same command, the same
    bytes) and ``--baseline`` reads back, older kind names mapped onto today's."""

    columns: list
    matrix: dict  # column -> layout -> {outcome, why | stats and counters, findings: [key]}
    findings: list[CampaignFinding]
    by_class: dict  # column -> class -> distinct findings
    # column -> relpath -> {statements, executed, missing, unreached} (kvbound/trace/coverage.py
    # Coverage.document); None: not measured (--no-coverage)
    coverage: dict | None = None
    # a guided campaign's rounds (kvbound/trace/guide.py Planner.record): per round its runs, each
    # with its mutation, parent and the new lines it reached per column; None: not guided
    guided: list | None = None

    def to_json(self) -> dict:
        d = {"format": CAMPAIGN_FORMAT, "columns": self.columns, "matrix": self.matrix,
             "findings": [f.to_json() for f in self.findings], "by_class": self.by_class}
        if self.coverage is not None:
            d["coverage"] = self.coverage
        if self.guided is not None:
            d["guided"] = self.guided
        return d

    @classmethod
    def from_json(cls, d, where: str = "campaign JSON") -> CampaignRecord:
        _format(d, where, CAMPAIGN_FORMAT)
        matrix = need(d, "matrix", where, dict)
        for col in matrix.values():
            for cell in col.values():
                cell["findings"] = [current_key(k) for k in cell.get("findings", ())]
        return cls(columns=_list(d, "columns", where), matrix=matrix,
                   findings=[CampaignFinding.from_json(f, f"{where}.findings[{i}]")
                             for i, f in enumerate(_list(d, "findings", where))],
                   by_class=need(d, "by_class", where, dict),
                   coverage=_optional(d, "coverage", where, _OPT_DICT, None),
                   guided=_optional(d, "guided", where, (list, type(None)), None))


MEASURED = ("cpu_s",)  # the fields of a campaign document's findings' detect that measure, not count


def reproducible(doc: dict) -> dict:
    """A campaign document (``CampaignRecord.to_json``) less its measurements (each finding's
    ``detect.cpu_s``: CPU time, which no two runs share): what two runs of one command hold
    byte for byte, wherever they ran."""
    out = dict(doc, findings=[dict(f) for f in doc.get("findings", ())])
    for f in out["findings"]:
        if isinstance(f.get("detect"), dict):
            f["detect"] = {k: v for k, v in f["detect"].items() if k not in MEASURED}
    return out
