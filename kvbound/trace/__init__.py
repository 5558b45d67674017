"""``kvbound trace``: vLLM's real engine-core scheduler stepping organic traffic (host side).

What runs in the release's side venv (the worker, the engine adapter, the fakes, the checks
and captures inside the engine) is the side package ``kvbound/side/``; this package is the
host: ``layouts`` (the engines), ``workload`` (seeded traffic), ``runner`` (segments and
findings; the checks at every captured call, spec and premises, are ``callcheck``'s),
``storecheck`` and ``lookup_checks`` (captured stores and lookups against the spec),
``shrink``, ``tracefile`` and ``campaign``.
"""
