"""kvbound's side package: everything that runs in a vLLM release's own venv.

Directory ``kvbound/side/``. Its modules run with ``PYTHONPATH=<release tree>`` in the
deps venv, where kvbound is NOT installed: they import the standard library, vLLM and each
other (relatively), never kvbound. There the package is loaded by path, as one unit,
under the name ``kvbound_side`` (``worker.py``, the entry script, registers it); on the
host it is importable as ``kvbound.side`` (the plugin's capture, unit tests of the pure
parts), and the host finds the entry script by path.

``worker`` the entry script; ``sidecar`` the protocol and what a worker reports;
``adapter`` vLLM on CPU (environment, hashing, model, specs, ``KVCacheConfig``);
``conform_worker`` one ``update_state_after_alloc`` per case; ``capture`` a call as a case;
``trace_worker`` one trace job; ``engine`` the real engine-core scheduler stepping a
workload; ``tap`` the one wrapper of each vLLM method the trace observes, which every
checker subscribes to; ``fakes`` the model runner, the transfer engine, the scripted tier;
``checks``, ``lookups``, ``shadow`` what the trace checks and captures inside the engine;
``findings`` the table of finding kinds (host and side read it); ``defects`` the planted defects.
"""
