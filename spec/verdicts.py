"""Every verdict a kvbound check reaches, as one ordered enum (as CrossHair's ``VerificationStatus``).

The three relations (docs/architecture.md) each conclude with one of these:
``kvbound prove`` (an obligation: ``proved`` / ``refuted``), ``check_plan`` and
``kvbound diff --against symbolic`` (a plan against the encoding: ``forced`` /
``not_forced``), ``kvbound conform`` (a real release against the spec: ``agree`` /
``disagree`` / ``fault`` / ``undriven`` / ``unsupported``); any solver call may end
``unknown``, which never counts as proved.

The order is the order of what a check established, lowest first: a counterexample
(the check's claim is false), then nothing (the solver gave up, or the case never
reached the code), then the claim holds. So the summary of many checks is their
``min``, and tables list verdicts in this order. The values are the strings the JSON
files hold, and a member equals its string (``Verdict.PROVED == "proved"``).
"""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    # a counterexample: the check's claim is false
    FAULT = "fault"  # conform: the release crashed, hung, or could not be driven by the adapter
    DISAGREE = "disagree"  # conform: the real release's result differs from the spec's
    NOT_FORCED = "not_forced"  # check_plan: the encoding allows outputs other than the plan's
    REFUTED = "refuted"  # prove: Z3 found a model of premises ∧ ¬claim (a witness)
    # nothing established
    UNKNOWN = "unknown"  # any solver call: unknown or a timeout, never counted as proved
    UNDRIVEN = "undriven"  # conform: vLLM's lookup did not take the case where the spec goes
    UNSUPPORTED = "unsupported"  # conform: the release refuses the case's configuration
    # the claim holds
    AGREE = "agree"  # conform: the real release's result equals the spec's
    FORCED = "forced"  # check_plan: the encoding allows exactly the plan's outputs
    PROVED = "proved"  # prove: premises ∧ ¬claim is unsat (and the premises are satisfiable)

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def holds(self) -> bool | None:
        """True: the claim holds; False: a counterexample; None: nothing established."""
        if self.rank < _RANK[Verdict.UNKNOWN]:
            return False
        return True if self.rank >= _RANK[Verdict.AGREE] else None

    def __lt__(self, other):
        return self.rank < Verdict(other).rank

    def __le__(self, other):
        return self.rank <= Verdict(other).rank

    def __gt__(self, other):
        return self.rank > Verdict(other).rank

    def __ge__(self, other):
        return self.rank >= Verdict(other).rank

    __hash__ = str.__hash__


_RANK = {v: i for i, v in enumerate(Verdict)}

# Which verdicts each relation reaches, in the enum's order.
PROOF_VERDICTS = (Verdict.REFUTED, Verdict.UNKNOWN, Verdict.PROVED)
PLAN_CHECK_VERDICTS = (Verdict.NOT_FORCED, Verdict.UNKNOWN, Verdict.FORCED)
CONFORM_VERDICTS = (Verdict.FAULT, Verdict.DISAGREE, Verdict.UNDRIVEN, Verdict.UNSUPPORTED, Verdict.AGREE)
DIFF_VERDICTS = (Verdict.DISAGREE, Verdict.UNKNOWN, Verdict.AGREE)  # kvbound diff: impl vs spec (and the symbolic model)
