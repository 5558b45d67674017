"""Every error kvbound raises on purpose, in one place, each with the exit code it ends in.

``kvbound.cli.main`` catches :class:`KvboundError` and prints its message as one line
(``kvbound COMMAND: error: MESSAGE``), then exits with the error's ``exit_code``; anything
else is a bug and keeps its traceback. A message names what was wrong (the case, the
field, the flag) and the rule it broke, so the reader can fix the input without the code.

This module imports only the standard library, so every layer may raise these: it is
the one module of the ``kvbound`` package that ``kvbound.spec``, ``kvbound.proofs`` and
``kvbound.impl`` import (see docs/architecture.md). Each class also derives from the
builtin it used to be (``ValueError``, ``RuntimeError``), so older ``except`` clauses hold.
"""

from __future__ import annotations

# Exit codes of every command, for CI.
EXIT_OK = 0  # all good
EXIT_FAIL = 1  # a check failed: an obligation missed its verdict, a disagreement, a stale file
EXIT_INPUT = 2  # bad input, an unpreparable release, or an inconclusive solver (never "proved")


class KvboundError(Exception):
    """Base of every deliberate kvbound error: printed as one line, exits with ``exit_code``."""

    exit_code = EXIT_INPUT


class InputError(KvboundError, ValueError):
    """The user's input (a file, a flag, a tensor) breaks a rule; the message names it."""


class UsageError(InputError):
    """A command-line flag or a combination of them that cannot be run."""


class CaseError(InputError):
    """A malformed or impossible case: which case, which field, which rule."""

    def __init__(self, case: str, field: str, rule: str):
        self.case, self.field, self.rule = case, field, rule
        super().__init__(f"case {case!r}: {field}: {rule}")


class UnsupportedVersion(InputError):
    """A vLLM release string kvbound does not model (malformed, or older than 0.20)."""


class BatchError(InputError):
    """A wrongly typed, shaped or placed input tensor of the batched impl: which field, what was expected."""

    def __init__(self, field: str, rule: str):
        self.field, self.rule = field, rule
        super().__init__(f"PlanBatch.{field}: {rule}")


class ScopeError(InputError):
    """An ``kvbound diff --exhaustive`` scope that does not parse: which key, what was expected."""


class ReportInputError(InputError):
    """A JSON file without the shape its report section reads: which file, where, what was expected."""


class PrepareError(KvboundError, RuntimeError):
    """Preparing a vLLM release (deps venv, release tree) failed; the message says why and what to do."""


class WorkerError(KvboundError, RuntimeError):
    """A release's conformance worker could not start; the message says what to do."""


class Terminated(KvboundError):
    """A signal (SIGTERM, SIGINT) ended a command that runs processes; it ended them too. Exits
    with the shell's convention, 128 + the signal's number (143 for SIGTERM)."""

    def __init__(self, signum: int):
        import signal

        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"ended by {signal.Signals(signum).name}; its pool processes and vLLM workers"
                         " were ended with it")


class TraceError(KvboundError, RuntimeError):
    """The trace harness (not vLLM) failed: the message says where."""


class LayoutUnsupported(TraceError):
    """The release lacks what a trace layout needs (``kvbound.trace.space.support``):
    the layout is skipped with this one line, and the run goes on."""


class MutantError(KvboundError, RuntimeError):
    """A spec mutant that cannot be applied to the current spec (its text is gone)."""


class SolverUnknown(KvboundError):
    """Z3 answered unknown (a timeout included) where a yes or no was needed; never read as proved."""
