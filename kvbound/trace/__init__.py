"""``kvbound trace``: vLLM's real engine-core scheduler stepping organic traffic.

``worker.py`` runs in the release's side venv (vLLM only); everything else here is
the host side: layouts, the seeded workload, the checks at every connector call,
shrinking and trace files.
"""
