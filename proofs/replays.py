"""Spec replays more than one property uses: a witness must show its failure on the executable spec.

A replay takes a refuted obligation's witness (a spec ``Case``) and returns None when the spec
reproduces the failure the obligation claims, else what it does instead.
"""

from __future__ import annotations

from kvbound.spec import AssertName, Variant, plan_for_version, plan_load
from kvbound.spec.versions import first_release, last_release


def replay_assert(variant, name: AssertName, asserts=True):
    """The spec of ``variant`` fires the assert ``name`` on the witness."""
    def check(case):
        plan = plan_load(case, variant, asserts)
        if plan.ok or plan.assertion.name is not name:
            return f"spec {Variant(variant).value} gives {plan.assertion.name.value if plan.assertion else 'ok'}, expected {name.value}"
        return None
    return check


def replay_window_retained(case):
    """The last release whose window in chunks does not count retained tokens (0.30) fires
    window_bound on the witness (a sliding window with retained tokens), the first that counts
    them (0.31) plans it."""
    before = last_release(lambda f: not f.window_counts_retained)
    counting = first_release(lambda f: f.window_counts_retained)
    old, new = plan_for_version(case, before), plan_for_version(case, counting)
    if old.ok or old.assertion.name is not AssertName.WINDOW_BOUND:
        return f"spec {before} gives {old.assertion.name.value if old.assertion else 'ok'}, expected window_bound"
    if not new.ok:
        return f"spec {counting} fails too: {new.assertion.name.value}"
    return None
