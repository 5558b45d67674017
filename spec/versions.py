"""Which spec variant a vLLM release runs (docs/vllm-semantics.md#load-start-scan, #asserts)."""

from __future__ import annotations

import re

from kvbound.errors import UnsupportedVersion

from .vocab import LATEST_ASSERTS, ReleaseAsserts, Variant

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")




def parse_version(version: str) -> tuple[int, int, int]:
    m = _VERSION.match(version.strip()) if isinstance(version, str) else None
    if not m:
        raise UnsupportedVersion(f"vLLM version {version!r} is not of the form MAJOR.MINOR[.PATCH], e.g. 0.29.0")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def variant_for_version(version: str) -> Variant:
    """0.20-0.29 legacy; 0.30-0.32 fixed; 0.33+ fixed-sync. Pre-releases map by their base."""
    major, minor, _ = parse_version(version)
    if (major, minor) < (0, 19):
        raise UnsupportedVersion(f"vLLM {version} has no offloading connector scheduler (it arrived in 0.19)")
    if (major, minor) < (0, 20):
        raise UnsupportedVersion(
            f"vLLM {version} counts hashed blocks of group 0 only (no scan); kvbound models 0.20 and later"
        )
    if (major, minor) < (0, 30):
        return Variant.LEGACY
    if (major, minor) < (0, 33):
        return Variant.FIXED
    return Variant.FIXED_SYNC


def release_asserts(version: str) -> ReleaseAsserts:
    """The window and keys asserts of a release, as each wheel's scheduler.py reads:
    0.20 has no window assert; 0.21-0.26 bound pending by window*bpc; 0.27 adds + 1;
    up to 0.27 every group's keys are checked, from 0.28 only a group with pending blocks."""
    variant_for_version(version)  # refuses what kvbound does not model
    minor = parse_version(version)[:2]
    if minor >= (0, 28):
        return LATEST_ASSERTS
    slack = None if minor < (0, 21) else (0 if minor < (0, 27) else 1)
    return ReleaseAsserts(window_slack=slack, keys_every_group=True)


def plan_for_version(case, version: str, asserts: bool = True):
    """The spec's plan of ``case`` as vLLM ``version`` computes it: its scan and its asserts."""
    from .plan import plan_load

    return plan_load(case, variant_for_version(version), asserts, release_asserts(version))
