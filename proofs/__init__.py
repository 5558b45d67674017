"""kvbound.proofs: the Z3 encoding of the load plan, the proof obligations, mutants.

Directory ``proofs/`` at the repository top, installed as ``kvbound.proofs``: layer 1,
the encoding ↔ spec relation (docs/architecture.md).

Imports only kvbound.spec (and z3). Organised by property: ``obligations`` is the index
(``PROPERTIES``, one module each: ``safe_load``, ``group_plan``, ``alignment``, ``reservation``,
``lookup``, ``store``, ``copy_contract``, every ``Obligation`` in ``OBLIGATIONS``); the mechanism below them is
the encoding (``terms``, ``encoding``), the worlds (``world``, ``hybrid``), the models
(``allocator``), the premises, the witnesses, ``problem`` (an obligation's shape) and
``runner``. ``check_plan`` holds any plan to the encoding; ``witness_cases`` gives every
witness the obligations produce as a spec Case; ``run_all`` runs the suite (``kvbound prove``
draws and reports it).
"""

from .obligations import OBLIGATIONS, Obligation
from .mutants import ENCODING_KNOB_MUTANTS
from .runner import Report, Result, run_all, run_obligation, witness_cases
from .symbolic import SymbolicCheck, check_plan, solve_plan

__all__ = [
    "OBLIGATIONS", "ENCODING_KNOB_MUTANTS", "Obligation", "Report", "Result",
    "SymbolicCheck", "check_plan", "run_all", "run_obligation", "solve_plan", "witness_cases",
]
