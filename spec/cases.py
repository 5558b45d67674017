"""Case files: the JSON form of a ``Case`` (the rules every case obeys: ``case.py``).

Every error names the case, the field and the rule, so a user fixes the file
without reading a traceback. A case may still be adversarial (unaligned N, a
table shorter than k): those are vLLM's asserts to find, not input errors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvbound.errors import CaseError

from .case import Case
from .vocab import NULL, Block, BlockState, Group, GroupConfig, GroupKind

CASE_FIELDS = (
    "name", "blocks_per_chunk", "tokens_per_hash", "num_prompt_tokens",
    "num_locally_computed_tokens", "num_external_tokens", "sync_load", "groups",
)
# case format v2: optional, and a v1 case (none of them) means what it meant
CASE_FIELDS_V2 = ("num_tokens", "partial_tail_boundary", "cache_hit_alignment_tokens", "decode_context_parallel_size")
GROUP_FIELDS = ("kind", "tokens_per_block", "sliding_window", "attention_chunk_size", "blocks")
GROUP_FIELDS_V2 = ("extra_retained_tokens", "is_eagle_group", "mamba_cache_mode", "offloaded")
# a v2 group field that only one kind may carry
_KIND_ONLY = {"extra_retained_tokens": GroupKind.SLIDING_WINDOW, "mamba_cache_mode": GroupKind.MAMBA}
_TOKEN = re.compile(r"^([HU])([1-9][0-9]*)$")




def parse_block(token: object, case: str = "?", field: str = "block") -> Block:
    if token == "N":
        return NULL
    m = _TOKEN.match(token) if isinstance(token, str) else None
    if not m:
        hint = " (block id 0 is the null block: write \"N\")" if token in ("H0", "U0") else ""
        raise CaseError(
            case, field,
            f"{token!r} is not a block token; expected \"N\", \"H<id>\" or \"U<id>\" with id >= 1,"
            f" e.g. \"H7\"{hint}",
        )
    return Block(BlockState(m.group(1)), int(m.group(2)))


def parse_table(tokens, case: str = "?", field: str = "blocks") -> tuple:
    if isinstance(tokens, str):
        tokens = tokens.split()
    return tuple(parse_block(t, case, f"{field}[{i}]") for i, t in enumerate(tokens))


def case_from_dict(d: object, where: str = "?") -> Case:
    """Type-check the JSON shape, then build (and so validate) the ``Case``."""
    if not isinstance(d, dict):
        raise CaseError(where, "(case)", f"must be a JSON object, got {type(d).__name__}")
    name = d.get("name", where)
    if not isinstance(name, str) or not name:
        raise CaseError(where, "name", f"must be a non-empty string, got {json.dumps(name)}")
    unknown = sorted(set(d) - set(CASE_FIELDS) - set(CASE_FIELDS_V2))
    if unknown:
        raise CaseError(
            name, unknown[0],
            f"unknown field; a case has {', '.join(CASE_FIELDS)} and optionally {', '.join(CASE_FIELDS_V2)}",
        )
    for f in CASE_FIELDS:
        if f not in d:
            raise CaseError(name, f, "missing required field")
    groups_raw = d["groups"]
    if not isinstance(groups_raw, list):
        raise CaseError(name, "groups", f"must be a list of group objects, got {json.dumps(groups_raw)}")
    groups = []
    for gi, g in enumerate(groups_raw):
        where_g = f"groups[{gi}]"
        if not isinstance(g, dict):
            raise CaseError(name, where_g, f"must be a JSON object, got {json.dumps(g)}")
        unknown = sorted(set(g) - set(GROUP_FIELDS) - set(GROUP_FIELDS_V2))
        if unknown:
            raise CaseError(
                name, f"{where_g}.{unknown[0]}",
                f"unknown field; a group has {', '.join(GROUP_FIELDS)} and optionally {', '.join(GROUP_FIELDS_V2)}",
            )
        for f in ("kind", "tokens_per_block", "blocks"):
            if f not in g:
                raise CaseError(name, f"{where_g}.{f}", "missing required field")
        try:
            kind = GroupKind(g["kind"])
        except ValueError:
            raise CaseError(
                name, f"{where_g}.kind",
                f"unknown kind {json.dumps(g['kind'])}; expected one of {', '.join(k.value for k in GroupKind)}",
            ) from None
        if not isinstance(g["blocks"], list):
            raise CaseError(name, f"{where_g}.blocks", f"must be a list of block tokens, got {json.dumps(g['blocks'])}")
        for fld, only in _KIND_ONLY.items():
            if fld in g and kind is not only:
                raise CaseError(
                    name, f"{where_g}.{fld}",
                    f"only a {only.value!r} group has {fld}; this group is {kind.value!r}",
                )
        groups.append(
            Group(
                GroupConfig(
                    kind, g["tokens_per_block"], g.get("sliding_window"), g.get("attention_chunk_size"),
                    extra_retained_tokens=g.get("extra_retained_tokens", 0),
                    is_eagle_group=g.get("is_eagle_group", False),
                    mamba_cache_mode=g.get("mamba_cache_mode"),
                    offloaded=g.get("offloaded", True),
                ),
                parse_table(g["blocks"], name, f"{where_g}.blocks"),
            )
        )
    for fld in ("num_tokens", "decode_context_parallel_size"):
        if fld in d and d[fld] is None:
            raise CaseError(name, fld, "must be an integer, or left out for its default")
    return Case(
        name=name,
        blocks_per_chunk=d["blocks_per_chunk"],
        tokens_per_hash=d["tokens_per_hash"],
        num_prompt_tokens=d["num_prompt_tokens"],
        num_locally_computed_tokens=d["num_locally_computed_tokens"],
        num_external_tokens=d["num_external_tokens"],
        groups=tuple(groups),
        sync_load=d["sync_load"],
        num_tokens=d.get("num_tokens", d["num_prompt_tokens"]),
        partial_tail_boundary=d.get("partial_tail_boundary"),
        cache_hit_alignment_tokens=d.get("cache_hit_alignment_tokens"),
        decode_context_parallel_size=d.get("decode_context_parallel_size", 1),
    )


def case_to_dict(case: Case) -> dict:
    groups = []
    for g in case.groups:
        gd = {"kind": g.config.kind.value, "tokens_per_block": g.config.tokens_per_block}
        if g.config.sliding_window is not None:
            gd["sliding_window"] = g.config.sliding_window
        if g.config.attention_chunk_size is not None:
            gd["attention_chunk_size"] = g.config.attention_chunk_size
        # v2 fields only where they differ from their default: a v1 case dumps as v1
        if g.config.extra_retained_tokens:
            gd["extra_retained_tokens"] = g.config.extra_retained_tokens
        if g.config.is_eagle_group:
            gd["is_eagle_group"] = True
        if g.config.mamba_cache_mode is not None:
            gd["mamba_cache_mode"] = g.config.mamba_cache_mode
        if not g.config.offloaded:
            gd["offloaded"] = False
        gd["blocks"] = [b.token for b in g.blocks]
        groups.append(gd)
    out = {
        "name": case.name,
        "blocks_per_chunk": case.blocks_per_chunk,
        "tokens_per_hash": case.tokens_per_hash,
        "num_prompt_tokens": case.num_prompt_tokens,
        "num_locally_computed_tokens": case.num_locally_computed_tokens,
        "num_external_tokens": case.num_external_tokens,
        "sync_load": case.sync_load,
    }
    if case.num_tokens != case.num_prompt_tokens:
        out["num_tokens"] = case.num_tokens
    if case.partial_tail_boundary is not None:
        out["partial_tail_boundary"] = case.partial_tail_boundary
    if case.cache_hit_alignment_tokens is not None:
        out["cache_hit_alignment_tokens"] = case.cache_hit_alignment_tokens
    if case.decode_context_parallel_size != 1:
        out["decode_context_parallel_size"] = case.decode_context_parallel_size
    out["groups"] = groups
    return out


def load_cases(path: str | Path, parse=case_from_dict) -> list[Case]:
    """A ``.json`` file (one case, or a list) or a ``.jsonl`` file (one case per line),
    each case read by ``parse(dict, where)`` (a lookup case: ``spec.lookup``)."""
    p = Path(path)
    if not p.exists():
        raise CaseError(str(p), "(file)", "no such file")
    text = p.read_text()
    if p.suffix == ".jsonl":
        return [parse(_loads(line, f"{p}:{n}"), f"{p}:{n}")
                for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if p.suffix != ".json":
        raise CaseError(str(p), "(file)", "a case file ends in .json or .jsonl")
    data = _loads(text, str(p))
    if isinstance(data, list):
        return [parse(d, f"{p}[{i}]") for i, d in enumerate(data)]
    return [parse(data, str(p))]


def load_case_paths(paths, parse=case_from_dict) -> list[Case]:
    """Files and directories (every .json/.jsonl inside, sorted) into one list, each case
    read by ``parse`` as in ``load_cases``."""
    out: list[Case] = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            for f in sorted(list(p.rglob("*.json")) + list(p.rglob("*.jsonl"))):
                out.extend(load_cases(f, parse))
        else:
            out.extend(load_cases(p, parse))
    return out


def _loads(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CaseError(where, "(file)", f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None


def dump_cases(cases, path: str | Path) -> None:
    p = Path(path)
    if p.suffix == ".jsonl":
        p.write_text("".join(json.dumps(case_to_dict(c)) + "\n" for c in cases))
    else:
        cases = list(cases)
        data = case_to_dict(cases[0]) if len(cases) == 1 else [case_to_dict(c) for c in cases]
        p.write_text(json.dumps(data, indent=2) + "\n")
