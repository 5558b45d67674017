"""Coverage-guided exploration of the configuration space (``kvbound campaign --guided R``).

The way greybox fuzzers (AFL, syzkaller) steer by coverage: a *corpus* of the runs that
reached connector lines no earlier run had, and each later round draws its runs from it.

- Round 0 runs the points the command line names (``space.chosen`` less ``--explore``'s draws).
- After each round (a barrier: every shard of it has finished) ``record`` adds each run's own
  coverage to the union of its release, in a fixed order (the round's runs in plan order, then
  the columns in matrix order, never the order shards finished in); the statements a run added
  are its *new lines*, and a run with any joins the corpus with that many as its energy.
- ``next`` draws the next round's ``per_round`` runs: a parent from the corpus with weight
  ``sqrt(energy) / 2 ** rounds``: its new lines (under a square root, as the first run of round 0
  takes every line all runs share, imports and the common path, and would drown the rest),
  halved for each earlier round it was drawn in, so a parent mutated in vain yields to others;
  then one mutation: move one or two axes of ``space.AXES`` that apply to its layout to another
  of their values (``MOVE``), re-seed its traffic (same point, a new seed, ``RESEED``), or put its
  axes on another named layout (``SWAP``; the moved axes that apply there stay). A draw that
  repeats a run, or that no release of the campaign supports, is drawn again; an empty corpus
  (nothing added a line) gives uniform draws (``FRESH``, as ``space.explore`` draws).

Planned without a clock: every draw comes from ``random.Random`` seeded by the campaign seed and
the round (a string seed: hashed by SHA-512, not by PYTHONHASHSEED), and the new lines from
the workers' coverage, which a seeded run repeats; the same command gives the same rounds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from . import layouts as L
from . import space
from .coverage import Coverage

CHOSEN, MOVE, RESEED, SWAP, FRESH = "chosen", "move", "reseed", "swap", "fresh"
MUTATIONS = ((MOVE, 0.6), (RESEED, 0.2), (SWAP, 0.2))  # each draw's mutation, by weight
TRIES = 64  # draws of one run before it falls back to a fresh one
SEEDS = 2 ** 31  # a re-seeded run's traffic seed is drawn below this


@dataclass(frozen=True)
class Run:
    """One run of a round: a point and its traffic seed, and where the planner got it."""

    point: str
    seed: int
    mutation: str = CHOSEN  # CHOSEN | MOVE | RESEED | SWAP | FRESH
    parent: str | None = None  # the label of the corpus run it was drawn from
    moved: tuple = ()  # MOVE: the axes moved; SWAP: the layout it was put on


def label(point: str, seed: int, campaign_seed: int) -> str:
    """The name a run has in the matrix: its point, and its seed where it is not the campaign's
    (``kvbound trace --point P --seed S`` replays it)."""
    return point if seed == campaign_seed else f"{point} seed {seed}"


class Planner:
    """The rounds of one guided campaign (the module docstring)."""

    def __init__(self, seed: int, per_round: int, supported=None, bases=None):
        self.seed = seed
        self.per_round = per_round
        self.supported = supported or (lambda point: True)  # point -> some release runs it
        self.bases = tuple(bases or L.LAYOUTS)  # the layouts SWAP and FRESH draw from
        self.unions: dict = {}  # column -> Coverage of every run recorded
        self.corpus: list = []  # [label, Run, energy, earlier rounds it was drawn in]
        self.ran: set = set()  # the labels planned so far
        self.rounds: list = []  # what the campaign document holds (record)
        self._drawn: set = set()  # the parents of the runs planned in the round being planned

    def label(self, run: Run) -> str:
        return label(run.point, run.seed, self.seed)

    def first(self, points) -> list:
        """Round 0: the points named, on the campaign's seed."""
        runs = [Run(p, self.seed) for p in dict.fromkeys(points)]
        self.ran.update(self.label(r) for r in runs)
        return runs

    def record(self, runs, coverage: dict, columns) -> dict:
        """A finished round: ``coverage`` is column -> run label -> that run's coverage (a shard's
        ``point_coverage``). Returns (and keeps) the round as the document holds it."""
        entries = []
        for run in runs:
            lab = self.label(run)
            new = {}
            for col in columns:
                got = coverage.get(col, {}).get(lab)
                if got is not None:
                    new[col] = self.unions.setdefault(col, Coverage()).add(got)
            total = sum(new.values())
            if total:
                self.corpus.append([lab, run, total, 0])
            entry = {"point": lab, "mutation": run.mutation, "new_lines": new}
            if run.parent is not None:
                entry["parent"] = run.parent
            if run.moved:
                entry["moved"] = list(run.moved)
            entries.append(entry)
        out = {"round": len(self.rounds), "runs": entries,
               "new_lines": sum(sum(e["new_lines"].values()) for e in entries),
               "corpus": len(self.corpus),
               "executed": {col: sum(len(f["executed"] & f["statements"]) for f in cov.files.values())
                            for col, cov in self.unions.items()}}
        self.rounds.append(out)
        return out

    def next(self) -> list:
        """The next round's runs (the module docstring)."""
        rng = random.Random(f"guided-{self.seed!r}-{len(self.rounds)}")
        self._drawn = set()
        runs = []
        for _ in range(self.per_round):
            run = None
            for _ in range(TRIES):
                cand = self._draw(rng)
                if cand is not None and self.label(cand) not in self.ran and self.supported(cand.point):
                    run = cand
                    break
            if run is None:  # the corpus's neighbourhood is spent: one uniform draw
                run = next((c for c in (self._fresh(rng) for _ in range(TRIES))
                            if self.label(c) not in self.ran and self.supported(c.point)), None)
            if run is None:
                continue
            self.ran.add(self.label(run))
            self._drawn.add(run.parent)
            runs.append(run)
        for entry in self.corpus:
            entry[3] += entry[0] in self._drawn
        return runs

    def weights(self) -> dict:
        """Each corpus run's weight as a parent in the round being planned (the module docstring)."""
        return {lab: math.sqrt(energy) / 2 ** rounds for lab, _, energy, rounds in self.corpus}

    def _parent(self, rng):
        entry = rng.choices(self.corpus, list(self.weights().values()))[0]
        return entry[0], entry[1]

    def _draw(self, rng) -> Run | None:
        if not self.corpus:
            return self._fresh(rng)
        parent, run = self._parent(rng)
        base, moved = space.split(run.point)
        how = rng.choices([m for m, _ in MUTATIONS], [w for _, w in MUTATIONS])[0]
        if how == RESEED:
            return Run(run.point, rng.randrange(SEEDS), RESEED, parent)
        if how == SWAP:
            others = [b for b in self.bases if b != base]
            if not others:
                return None
            new_base = rng.choice(others)
            keep = {k: v for k, v in moved.items() if space.BY_NAME[k].applies(L.LAYOUTS[new_base])}
            return Run(space.point_name(new_base, keep), self.seed, SWAP, parent, (new_base,))
        lay = L.LAYOUTS[base]
        axes = [a for a in space.AXES if a.applies(lay) and len(a.values) > 1]
        if not axes:
            return None
        picked = sorted(rng.sample(axes, min(len(axes), rng.choice((1, 2)))), key=space.AXES.index)
        for a in picked:
            now = moved.get(a.name, a.value_of(lay))
            moved[a.name] = rng.choice([v for v in a.values if v != now])
        return Run(space.point_name(base, moved), self.seed, MOVE, parent, tuple(a.name for a in picked))

    def _fresh(self, rng) -> Run:
        """One uniform draw, as ``--explore`` draws (``space.explore``, on a seed drawn here)."""
        return Run(space.explore(self.bases, 1, rng.randrange(SEEDS))[0], self.seed, FRESH)


def round_line(rnd: dict) -> str:
    """One round in one line (the campaign's progress and its text output)."""
    runs = rnd["runs"]
    adding = sum(1 for e in runs if sum(e["new_lines"].values()))
    tail = "".join(f"; {col}: {n} statements reached" for col, n in rnd["executed"].items())
    return (f"round {rnd['round']}: {len(runs)} run(s), {adding} reached new lines"
            f" (+{rnd['new_lines']} statements), corpus {rnd['corpus']}{tail}")
