"""kvbound.conform: the spec against vLLM's own OffloadingConnectorScheduler.

Directory ``kvbound/conform/``, part of the tool (layer 2): the real vLLM ↔ spec relation
(docs/architecture.md).

``prepare`` builds (once, cached) what a release needs to import on a CPU-only
machine; the worker that runs inside that environment (vLLM and the standard library
only) is the side package's (``kvbound/side/conform_worker.py``, as is ``capture``, which
dumps the case of every loading call from a running engine); ``runner`` feeds it cases;
``compare`` judges each result against ``kvbound.spec.plan_load`` and builds the version
matrix; ``mutants`` plants the mutant table's spec mutants at runtime for
``--spec-mutants``.
"""
