"""kvbound.proofs: the Z3 encoding of the load plan, the proof obligations, mutants.

Imports only kvbound.spec (and z3). ``check_plan`` holds any plan to the encoding;
``witness_cases`` gives every witness the obligations produce as a spec Case.
"""

from .symbolic import SymbolicCheck, check_plan, solve_plan

__all__ = ["SymbolicCheck", "check_plan", "solve_plan"]
