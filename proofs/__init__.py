"""kvbound.proofs: the Z3 encoding of the load plan, the proof obligations, mutants.

Directory ``proofs/`` at the repository top, installed as ``kvbound.proofs``: layer 1,
the encoding ↔ spec relation (docs/architecture.md).

Imports only kvbound.spec (and z3). ``check_plan`` holds any plan to the encoding;
``witness_cases`` gives every witness the obligations produce as a spec Case;
``run_all`` runs the suite (``kvbound prove`` draws and reports it).
"""

from .obligations import OBLIGATIONS, PROVED, REFUTED, Obligation
from .mutants import ENCODING_KNOB_MUTANTS
from .runner import UNKNOWN, Report, Result, run_all, run_obligation, witness_cases
from .symbolic import SymbolicCheck, check_plan, solve_plan

__all__ = [
    "OBLIGATIONS", "PROVED", "REFUTED", "UNKNOWN", "ENCODING_KNOB_MUTANTS", "Obligation", "Report", "Result",
    "SymbolicCheck", "check_plan", "run_all", "run_obligation", "solve_plan", "witness_cases",
]
