"""Every limit kvbound gives Z3, in one object and one unit: seconds (as ``kvbound prove --timeout``).

As CrossHair's ``options.py`` owns its timeouts, ``SolverOptions`` owns ours: no other
module sets a Z3 timeout or seed, and every solver comes from ``SolverOptions.solver``.
A call that runs out of time answers ``unknown``; ``is_sat`` turns that into a
``SolverUnknown`` where a caller needs a yes or no, and the obligation runner records it
as the verdict ``unknown`` — never as proved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import z3

from kvbound.errors import SolverUnknown

MS_PER_S = 1000


@dataclass(frozen=True)
class SolverOptions:
    timeout_s: float  # per solver call (one check()); past it Z3 answers unknown
    seed: int = 0  # Z3's random_seed, pinned so verdicts and models repeat run to run
    logic: str | None = None  # SolverFor(logic), e.g. QF_LIA for ground queries; None: z3.Solver()
    first_try_s: float = 1.0  # a mutant's unbounded check, before the bounded search takes over

    @property
    def timeout_ms(self) -> int:
        return max(1, round(self.timeout_s * MS_PER_S))

    def solver(self, timeout_s: float | None = None) -> z3.Solver:
        """A fresh solver with this seed and timeout (``timeout_s`` overrides the timeout)."""
        s = z3.SolverFor(self.logic) if self.logic else z3.Solver()
        s.set("random_seed", self.seed)
        s.set("timeout", self.timeout_ms if timeout_s is None else max(1, round(timeout_s * MS_PER_S)))
        return s

    def with_timeout(self, timeout_s: float) -> SolverOptions:
        return replace(self, timeout_s=timeout_s)


# kvbound prove (run_all) and the witnesses conformance replays (witness_cases)
PROVE = SolverOptions(timeout_s=10.0)
# one obligation on its own (run_obligation, decide): tests, the report's fixtures
OBLIGATION = SolverOptions(timeout_s=5.0)
# kvbound catalogue: generous, because the committed page must come out the same every run
CATALOGUE = SolverOptions(timeout_s=20.0)
# check_plan / solve_plan (kvbound diff --against symbolic, bench): ground linear queries
PLAN_CHECK = SolverOptions(timeout_s=2.0, logic="QF_LIA")
# a premise's Z3 face on a concrete case (kvbound premises): ground, small
PREMISE = SolverOptions(timeout_s=10.0)


def is_sat(s: z3.Solver, *assumptions) -> bool:
    """``s.check()`` as a yes or no: unknown (a timeout included) raises ``SolverUnknown``."""
    r = s.check(*assumptions)
    if r == z3.unknown:
        raise SolverUnknown(f"Z3 answered unknown ({s.reason_unknown()}); raise the timeout or narrow the query")
    return r == z3.sat
