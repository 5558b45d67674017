"""kvbound: verification kit for vLLM's KV-offload load boundary.

Directory ``kvbound/``, the tool (layer 2); the layers it installs beside itself live at
the repository top: ``spec/``, ``proofs/``, ``impl/`` (docs/architecture.md).

Layers (each depends only downward): ``kvbound.spec`` (vocabulary and executable
reference), ``kvbound.proofs`` (Z3 obligations), ``kvbound.impl`` (batched torch
oracle), and the tool here (``kvbound`` console script, drawing, conformance).
"""

__version__ = "0.1.0"
