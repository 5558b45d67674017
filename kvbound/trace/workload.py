"""The seeded workload: organic traffic as the seed's production saw it.

Requests share prefixes of organically varied lengths (documents re-read at a
random-walking depth, multi-turn follow-ups that extend an earlier request with
its own output, truncated re-sends, unique fillers that evict), arrive in bursts,
and some are aborted. Lengths are not block-aligned, so the locally computed
boundary walks across block offsets. Everything comes from ``random.Random(seed)``:
the same seed gives the same requests.

A request is JSON for the worker: ``id``, ``arrive`` (step), ``prompt`` (segments:
``["doc", d, start, n]``, ``["out", rid, n]`` = rid's first n sampled tokens,
``["uniq", rid, n]``), ``max_tokens``, ``abort_after`` (steps, or None); and, only where the
engine asks for them (drawn from a stream of their own, so the organic stream stays as it was):
``kv_transfer_params`` (``load_tiers_p``: a tier filter, ``LOAD_TIERS``; ``load_limit_p``: a cap on
the tokens one lookup may load, ``LOAD_LIMITS``; ``offload_limit_p``: a cap on what it offloads,
``OFFLOAD_LIMITS``) and ``prompt_logprobs``
(``prompt_logprobs_p``: a request that skips reading the prefix cache).
"""

from __future__ import annotations

import random

from .layouts import block_sizes, max_prompt_tokens

NUM_DOCS = 6
# The kv_load_tiers values a request's kv_transfer_params carry under load_tiers_p, as a client may
# send them: each branch of the connector's parser (0.33.0 offloading/scheduler.py:496-537
# _parse_tier_filter): matchers by medium and by locality (any case), the empty list (load from no
# secondary tier), and the malformed ones the parser skips or falls back to every tier for.
LOAD_TIERS = ([{"medium": "cpu"}], [{"medium": "STORAGE", "locality": "local"}], [], [{"locality": "remote"}],
              "cpu", [3, {"medium": "tape"}], [{"medium": 7}], [{"locality": "moon"}, {"medium": "storage"}])
# The max_load_tokens values under load_limit_p (0.33.0 offloading/scheduler.py:384-396: a non-negative
# int caps the hit, _lookup_complete_chunks :866-870 and _lookup_partial_tail :1097-1101; anything else is
# ignored with a warning): none, a token, a block and a few, a long prompt's worth, and two it ignores.
LOAD_LIMITS = (0, 1, 16, 40, 200, -1, "all")
# The max_offload_tokens values under offload_limit_p (0.33.0 offloading/scheduler.py:399-410, the same
# parse; _calc_num_offloadable_tokens :762-768 caps the stores, the boundary store :1662-1668 asserts
# its boundary is within the cap): none, a block, a chunk of 528 tokens, a long prompt's worth, one ignored.
OFFLOAD_LIMITS = (0, 16, 64, 528, 1000, "all")


def seg_len(seg) -> int:
    return seg[3] if seg[0] == "doc" else seg[2]


def prompt_len(prompt) -> int:
    return sum(seg_len(s) for s in prompt)


def truncate(prompt, n: int) -> list:
    """The first n tokens of a segmented prompt."""
    out = []
    for s in prompt:
        if n <= 0:
            break
        L = seg_len(s)
        if L <= n:
            out.append(list(s))
        elif s[0] == "doc":
            out.append(["doc", s[1], s[2], n])
        else:
            out.append([s[0], s[1], n])
        n -= min(L, n)
    return out


def workload(n: int, seed, layout: dict, engine: dict, first_id: int = 0) -> list[dict]:
    rng = random.Random(repr(seed))
    b = max(block_sizes(layout))
    cap = max_prompt_tokens(layout, engine)
    depth = [rng.randint(1, cap) for _ in range(NUM_DOCS)]  # each document's random-walking depth
    reqs: list[dict] = []
    step = 0
    burst_p = engine.get("prefix_burst_p") or 0.0
    brng = random.Random(repr(seed) + "-burst") if burst_p else None  # the organic stream stays as it was
    source, left = None, 0  # the current burst's seeding read; its readers still to come
    for i in range(n):
        rid = first_id + i
        if brng is not None and (left or brng.random() < burst_p):
            if not left:  # a burst starts: its seeding read now, 2..5 readers a few steps on
                source = _burst_request(brng, None, step, rid, b, cap)
                left = brng.randint(2, 5)
                reqs.append(source)
                step += brng.randint(2, 8)
                continue
            left -= 1
            reqs.append(_burst_request(brng, source, step, rid, b, cap))
            continue
        if rng.random() < 0.3:
            step += 0  # a burst: same step as the previous request
        else:
            step += rng.choice((0, 1, 1, 2, 3, 5, 8))
        r = rng.random()
        if r < 0.45 or not reqs:  # a document read to an organically varied depth
            d = rng.randrange(NUM_DOCS)
            depth[d] = max(1, min(cap - 1, depth[d] + int(rng.gauss(0, 1.5 * b))))
            prompt = [["doc", d, 0, depth[d]]]
        elif r < 0.70:  # a multi-turn follow-up: an earlier prompt, its output, a new turn
            prev = rng.choice(reqs[-30:])
            prompt = prev["prompt"] + [["out", prev["id"], rng.randint(0, prev["max_tokens"])]]
        elif r < 0.85:  # a truncated re-send of an earlier prompt
            prev = rng.choice(reqs[-30:])
            L = prompt_len(prev["prompt"])
            prompt = truncate(prev["prompt"], rng.randint(1, max(1, L)))
        else:  # a unique filler: evicts from the GPU
            prompt = []
        prompt = prompt + [["uniq", rid, rng.choice((0, 0, 1, rng.randint(1, b), rng.randint(1, 3 * b)))]]
        prompt = [s for s in truncate(prompt, cap) if seg_len(s) > 0]
        if not prompt:
            prompt = [["uniq", rid, 1]]
        max_tokens = rng.choice((1, 2, 4, rng.randint(1, 16), rng.randint(1, 48)))
        if engine.get("aligned_decode_p") and rng.random() < engine["aligned_decode_p"]:
            # a decode that ends on a chunk boundary: the finished request's last chunk
            # ends at its final sampled token (the store horizon at finish)
            tpc = min(block_sizes(layout)) * layout.get("blocks_per_chunk", 1)
            n = prompt_len(prompt)
            max_tokens = (n // tpc + 1 + rng.randint(0, 2)) * tpc - n
        abort = rng.randint(0, 8) if rng.random() < engine.get("abort_p", 0.04) else None
        reqs.append({"id": rid, "arrive": step, "prompt": prompt, "max_tokens": max_tokens,
                     "abort_after": abort})
    if engine.get("prompt_cap"):  # prompts up to max_model_len: vLLM refuses prompt + max_tokens past it
        lrng = random.Random(repr(seed) + "-long")  # one request in ten reads a document to within 2 blocks of it
        for r in reqs:
            if lrng.random() < 0.1:
                r["prompt"] = [["doc", lrng.randrange(NUM_DOCS), 0, cap - lrng.randint(0, 2 * b)]]
    for r in reqs:  # within max_model_len (it binds where prompts come near it: prompt_cap, --engine max_model_len)
        r["max_tokens"] = max(1, min(r["max_tokens"], engine["max_model_len"] - prompt_len(r["prompt"])))
    _request_params(reqs, seed, engine)
    return reqs


def _request_params(reqs: list, seed, engine: dict) -> None:
    """``load_tiers_p``, ``load_limit_p``, ``prompt_logprobs_p``, ``offload_limit_p``: the share of
    requests that carry a tier filter (``LOAD_TIERS``), a load limit (``LOAD_LIMITS``), ask for prompt
    logprobs, or carry an offload limit (``OFFLOAD_LIMITS``),
    drawn from a stream of their own."""
    tiers_p, logprobs_p = engine.get("load_tiers_p") or 0.0, engine.get("prompt_logprobs_p") or 0.0
    limit_p = engine.get("load_limit_p") or 0.0
    offload_p = engine.get("offload_limit_p") or 0.0
    if not (tiers_p or logprobs_p or limit_p or offload_p):
        return
    prng = random.Random(repr(seed) + "-params")
    for r in reqs:
        if prng.random() < tiers_p:
            r["kv_transfer_params"] = {"kv_load_tiers": prng.choice(LOAD_TIERS)}
        if limit_p and prng.random() < limit_p:
            r.setdefault("kv_transfer_params", {})["max_load_tokens"] = prng.choice(LOAD_LIMITS)
        if prng.random() < logprobs_p:
            r["prompt_logprobs"] = 1
        if offload_p and prng.random() < offload_p:
            r.setdefault("kv_transfer_params", {})["max_offload_tokens"] = prng.choice(OFFLOAD_LIMITS)


def _burst_request(rng, source: dict | None, step: int, rid: int, b: int, cap: int) -> dict:
    """``prefix_burst_p``: shared-prefix bursts. A burst is a seeding read (``source`` None: a
    document read to a depth up to half the prompt cap, ending anywhere in a block) and, a few
    steps later when its blocks are computed and cached, 2..5 readers arriving in one step that
    re-read the same document from a block short of the seed's depth to two blocks past it, then a
    few tokens of their own. Their hits end at other offsets of the same blocks, some computed
    before the step and some by the burst itself: the traffic under which one request's hit lands
    on a block another request of the step caches, or on another's private copy of a cached block
    (docs/findings.md)."""
    if source is None:
        prompt = [["doc", rng.randrange(NUM_DOCS), 0, rng.randint(1, max(1, cap // 2))]]
    else:
        doc = source["prompt"][0]
        prompt = [["doc", doc[1], 0, max(1, min(cap - 1, doc[3] + rng.randint(-b, 2 * b)))],
                  ["uniq", rid, rng.choice((0, 1, rng.randint(1, b)))]]
    return {"id": rid, "arrive": step, "prompt": [s for s in truncate(prompt, cap) if seg_len(s) > 0],
            "max_tokens": rng.choice((1, 2, rng.randint(1, 16))), "abort_after": None}
