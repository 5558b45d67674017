"""Which spec variant a vLLM release runs (FACTS.md, release by release)."""

from __future__ import annotations

import re

from .vocab import Variant

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


class UnsupportedVersion(ValueError):
    pass


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
