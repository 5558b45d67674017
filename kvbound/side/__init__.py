"""What runs in a release's side venv (standard library and vLLM only; imports nothing of kvbound)."""
