"""``kvbound trace``: vLLM's real engine-core scheduler stepping organic traffic.

Worker side (runs in the release's side venv, vLLM and the standard library only; the
side package ``kvbound_trace_side``): ``worker.py`` the entry script and job protocol,
``engine.py`` the adapter that builds and steps the real engine and captures every
connector call, ``fakes.py`` what stands in for the model runner, the transfer engine
and an adversarial tier, ``checks.py`` the lifecycle promises checked inside the
engine. The plumbing shared with conform's worker is ``kvbound/conform/sidecar.py``.

Host side: ``layouts`` (the engines, one ``Layout`` record each), ``workload`` (seeded traffic),
``runner`` (segments and findings; the checks at every captured call, spec and premises, are
``callcheck``'s), ``session`` (one release's trace session: what ``kvbound trace`` and each
campaign shard run), ``shrink``, ``tracefile`` and ``campaign``. The finding kinds are the
findings table's (``kvbound/side/findings.py``).
"""
