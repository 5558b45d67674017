"""``kvbound trace``: vLLM's real engine-core scheduler stepping organic traffic (host side).

What runs in the release's side venv (the worker, the engine adapter, the fakes, the checks
and captures inside the engine) is the side package ``kvbound/side/``; this package is the
host: ``layouts`` (the engines, one ``Layout`` record each), ``space`` (the configuration
space: points, named layouts and axes), ``workload`` (seeded traffic),
``runner`` (segments and findings; the checks at every captured call, spec and premises, are
``callcheck``'s), ``storecheck`` and ``lookup_checks`` (captured stores and lookups against the
spec), ``session`` (one release's trace session: what ``kvbound trace`` and each campaign shard
run), ``shrink``, ``tracefile`` and ``campaign``. The finding kinds are the findings table's
(``kvbound/side/findings.py``).
"""
