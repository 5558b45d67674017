"""Generated lookup cases (``kvbound conform --lookup-cases N``), in the style of
``strategies.py``: seeded ``random.Random``, one stream per family, so adding a family
changes no other. Each case is a fresh request (no transfers, nothing being loaded)
against a tier whose answers per key are drawn: mostly HIT, some MISS (gaps),
HIT_PENDING and RETRY, and keys answered twice (pending, then ready).

Families: ``lookup/full`` (one or two full-attention groups), ``lookup/swa`` (full
attention + a sliding window), ``lookup/mamba`` (full attention + Mamba, hashed below
the block: partial tails on 0.28+), ``lookup/eagle`` (full attention + an EAGLE/MTP
drafter group, with or without a sliding window).
"""

from __future__ import annotations

import random
from typing import Iterator

from .lookup_case import Answer, LookupCase, LookupGroup, default_lookup_groups
from .vocab import cdiv

LOOKUP_FAMILIES = ("lookup/full", "lookup/swa", "lookup/mamba", "lookup/eagle")


def _answer(rng: random.Random, retry: bool) -> tuple:
    x = rng.random()
    if x < 0.12:
        return (Answer.MISS,)
    if x < 0.22:
        return (Answer.HIT_PENDING,) if rng.random() < 0.6 else (Answer.HIT_PENDING, Answer.HIT)
    if x < 0.27 and retry:
        return (Answer.RETRY,)
    return (Answer.HIT,)


def _group(gi, kind, tpc, num_keys, window=None, sliding_window=0, eagle=False):
    return LookupGroup(group_idx=gi, kind=kind, tokens_per_chunk=tpc, num_keys=num_keys, window=window,
                       sliding_window=sliding_window, eagle=eagle)


def build_lookup_case(rng: random.Random, family: str, name: str, retry: bool = True) -> LookupCase:
    tph = 16
    if family == "lookup/mamba":
        b = 64
    elif family == "lookup/full":
        b = rng.choice((16, 32))
    else:
        b = 16
    P = rng.randint(b, 14 * b)
    num_tokens = P
    nk = num_tokens // b
    if family == "lookup/full":
        groups = [_group(0, "full_attention", b, nk)]
        if rng.random() < 0.4:
            groups.append(_group(1, "full_attention", b, nk))
    elif family == "lookup/swa":
        sw = rng.choice((32, 48, 64, 100, 128))
        groups = [_group(0, "full_attention", b, nk), _group(1, "sliding_window", b, nk, cdiv(sw, b), sw)]
    elif family == "lookup/mamba":
        groups = [_group(0, "full_attention", b, nk), _group(1, "mamba", b, nk, 1)]
    else:
        groups = [_group(0, "full_attention", b, nk)]
        if rng.random() < 0.5:
            sw = rng.choice((32, 64))
            groups.append(_group(1, "sliding_window", b, nk, cdiv(sw, b), sw))
        groups.append(_group(len(groups), "full_attention", b, nk, eagle=True))
    N = b * rng.randint(0, max(0, nk // 2))
    tier = {}
    gap_p = rng.random() * 0.5
    for g in groups:
        for c in range(N // b, nk):
            a = _answer(rng, retry)
            if rng.random() < gap_p * 0.2:
                a = (Answer.MISS,)
            tier[f"{g.group_idx}:{c}"] = a
    if family == "lookup/mamba":
        for g in groups:
            for T in range(N + tph, P, tph):
                if T % b:
                    tier[f"{g.group_idx}:b:{T}"] = _answer(rng, retry)
    mamba = b if family == "lookup/mamba" else None
    return LookupCase(name=name, num_computed_tokens=N, num_tokens=num_tokens, num_prompt_tokens=P,
                      groups=tuple(groups), lookup_groups=default_lookup_groups(groups), tokens_per_hash=tph,
                      num_block_hashes=num_tokens // tph, tier=tier, mamba_align_size=mamba)


def random_lookup_cases(n: int, seed: int = 0, family: str = "lookup/swa", retry: bool = True) -> Iterator[LookupCase]:
    if family not in LOOKUP_FAMILIES:
        raise ValueError(f"lookup family {family!r}: one of {', '.join(LOOKUP_FAMILIES)}")
    rng = random.Random(f"{seed}-{family}")
    for i in range(n):
        yield build_lookup_case(rng, family, f"{family.replace('/', '-')}-{seed}-{i}", retry)
