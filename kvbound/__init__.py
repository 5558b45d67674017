"""kvbound: verification kit for vLLM's KV-offload load boundary.

Layers (each depends only downward): ``kvbound.spec`` (vocabulary and executable
reference), ``kvbound.proofs`` (Z3 obligations), ``kvbound.impl`` (batched torch
oracle), and the tool here (``kvbound`` console script, drawing, conformance).
"""

__version__ = "0.1.0"
