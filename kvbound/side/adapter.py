"""The one adapter to a vLLM release on CPU: what every side-venv worker and every
standalone reproducer in ``scripts/`` needs to boot vLLM's scheduler without a GPU, a
model or the Hugging Face hub.

- ``quiet_environment`` / ``stub_einops``: the environment vLLM is imported in;
- ``hashing``: the release's ``sha256`` (its module moved in 0.27), with
  ``init_none_hash`` done, as the engine core does before any request is hashed;
- ``model_dir`` / ``register_never_built``: a local Llama ``config.json`` and a model class
  vLLM inspects but never instantiates;
- ``KINDS`` / ``kind_of`` / ``kv_cache_spec``: a group kind (kvbound's names) <-> the
  release's ``KVCacheSpec`` class;
- ``kv_cache_config``: the ``KVCacheConfig`` of those specs, built by hand as vLLM's own
  tests build it;
- ``fields`` / ``build`` / ``first_attr``: a release's dataclass from the fields it has, and a
  field under whichever name the release gives it;
- ``secondary_tier``: the ``secondary_tiers`` entry of a tier class the trace defines, loaded as
  the release lets an out-of-tree tier in.

Standard library only at import (vLLM and torch are imported where they are used); part
of the side package (``kvbound/side/``), loaded by path where kvbound is not installed.
"""

import atexit
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import types
import warnings

# group kind <-> KVCacheSpec class name, checked in this order: a subclass before its base
KINDS = (
    ("chunked_local", "ChunkedLocalAttentionSpec"),
    ("sliding_window", "SlidingWindowSpec"),
    ("mamba", "MambaSpec"),
    ("full_attention", "FullAttentionSpec"),
)


def quiet_environment():
    """What a worker imports vLLM under: errors only, no hub, no warnings, and the einops stub."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    stub_einops()


def stub_einops():
    """0.29's scheduler import chain reaches vit_attn_wrappers, which imports einops
    (pure Python, not in the import-deps lock); nothing here calls it."""
    try:
        import einops  # noqa: F401
    except ImportError:
        m = types.ModuleType("einops")
        m.rearrange = m.repeat = m.reduce = m.einsum = m.pack = m.unpack = (
            lambda *a, **k: (_ for _ in ()).throw(RuntimeError("einops stub")))
        sys.modules["einops"] = m


def hashing():
    """The release's ``sha256`` block hash, after ``init_none_hash`` (``vllm.utils.hashing``
    since 0.27, ``vllm.utils`` before)."""
    from vllm.v1.core import kv_cache_utils as kcu

    try:
        from vllm.utils.hashing import sha256
    except ImportError:
        from vllm.utils import sha256
    kcu.init_none_hash(sha256)
    return sha256


def model_dir(**config):
    """A local Llama ``config.json`` (no Hugging Face hub) in a fresh temporary directory,
    removed when the process exits; ``config`` overrides or adds fields."""
    d = tempfile.mkdtemp(prefix="kvbound-model-")
    atexit.register(shutil.rmtree, d, True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
           "num_hidden_layers": 2, "vocab_size": 65536, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5, "torch_dtype": "float32"}
    cfg.update(config)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def register_never_built(*architectures):
    """Each architecture as a model class vLLM only inspects (``ModelRegistry``)."""
    import torch.nn as nn
    from vllm import ModelRegistry

    class KvboundNeverBuiltModel(nn.Module):
        """Never instantiated: only its interface is inspected."""

        def __init__(self, *, vllm_config, prefix=""):
            super().__init__()

        def embed_input_ids(self, input_ids):
            raise NotImplementedError

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            raise NotImplementedError

        def compute_logits(self, hidden_states):
            raise NotImplementedError

    for name in architectures:
        ModelRegistry.register_model(name, KvboundNeverBuiltModel)


# -- KV-cache specs and config ------------------------------------------------------------------

def kind_of(kv_cache_spec):
    """kvbound's group kind of a release's ``KVCacheSpec`` (by its class or a base)."""
    names = {c.__name__ for c in type(kv_cache_spec).__mro__}
    for kind, cls_name in KINDS:
        if cls_name in names:
            return kind
    raise ValueError("kvbound has no group kind for %s" % type(kv_cache_spec).__name__)


def kv_cache_spec(group, head_size=8, state_size=64, **more):
    """The release's ``KVCacheSpec`` of one group (kvbound's layout/case fields: ``kind``,
    ``tokens_per_block``, ``sliding_window``, ``extra_retained_tokens``,
    ``attention_chunk_size``, ``mamba_cache_mode``), one KV head, float32; ``more``: further
    fields where the release's class has them."""
    import torch
    from vllm.v1 import kv_cache_interface as kci

    t = torch.float32
    b = group["tokens_per_block"]
    kind = group["kind"]
    attention = dict(block_size=b, num_kv_heads=1, head_size=head_size, dtype=t, **more)
    if kind == "full_attention":
        return build(kci.FullAttentionSpec, **attention)
    if kind == "sliding_window":
        return build(kci.SlidingWindowSpec, sliding_window=group["sliding_window"],
                     extra_retained_tokens=group.get("extra_retained_tokens") or 0, **attention)
    if kind == "chunked_local":
        return build(kci.ChunkedLocalAttentionSpec, attention_chunk_size=group["attention_chunk_size"],
                     **attention)
    if kind == "mamba":
        return build(kci.MambaSpec, block_size=b, shapes=((state_size,),), dtypes=(t,),
                     mamba_cache_mode=group.get("mamba_cache_mode") or "align", **more)
    raise ValueError("unknown group kind %r" % (kind,))


def kv_cache_config(specs, num_blocks, eagle=(), offloaded=None, tensors=False, layer_names=None, **more):
    """The ``KVCacheConfig`` of ``specs``, one layer per group (``layer_names``, default
    ``layer.<i>``); ``eagle``: the groups vLLM's planner tags ``is_eagle_group``;
    ``offloaded``: per group, ``enable_kv_transfer``; ``tensors``: one shared tensor sized
    for ``num_blocks`` pages (0.29 sizes the CPU tier from ``kv_cache_tensors[0].size``),
    else none (the manager never reads them); ``more``: further fields where the release
    has them."""
    from vllm.v1 import kv_cache_interface as kci

    names = list(layer_names or ["layer.%d" % i for i in range(len(specs))])
    groups = []
    for i, s in enumerate(specs):
        kw = {"is_eagle_group": True} if i in eagle else {}
        if offloaded is not None:
            kw["enable_kv_transfer"] = offloaded[i]
        groups.append(build(kci.KVCacheGroupSpec, layer_names=[names[i]], kv_cache_spec=s, **kw))
    pages = [s.page_size_bytes for s in specs]
    kv_tensors = [build(kci.KVCacheTensor, size=num_blocks * sum(pages), shared_by=names, layers=names,
                        layer_stride=num_blocks * max(pages), block_stride=sum(pages))] if tensors else []
    return build(kci.KVCacheConfig, num_blocks=num_blocks, kv_cache_tensors=kv_tensors,
                 kv_cache_groups=groups, **more)


# -- a release's dataclasses -------------------------------------------------------------------

_NO_DEFAULT = object()


def first_attr(obj, *names, default=_NO_DEFAULT):
    """The field under whichever of ``names`` this release uses (releases rename fields: 0.26
    turned the connector's blocks into chunks); ``default`` where it has none, else
    ``AttributeError``."""
    for n in names:
        if hasattr(obj, n):
            return getattr(obj, n)
    if default is not _NO_DEFAULT:
        return default
    raise AttributeError("none of %s on %s" % (names, type(obj).__name__))


def fields(cls):
    if cls is None:
        return set()
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "_fields", ())) | set(getattr(cls, "__annotations__", {}))


def build(cls, **kw):
    """A release's dataclass from the fields it has (releases add and drop fields)."""
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in kw.items() if k in names}
    return cls(**kw)


def secondary_tier(name, module_name, make_class):
    """The tiering spec's ``secondary_tiers`` entry of an out-of-tree tier: class ``name`` of module
    ``module_name``, which ``make_class()`` defines (once per process, in ``sys.modules``). By
    ``module_path`` where the tier factory loads an out-of-tree tier from the config alone (0.28.0+,
    ``get_tier_class``; 0.33.0 tiering/factory.py:100-143, as a user deploys one), else by name once
    registered (``register_tier``, 0.22.1 tiering/factory.py:17-25)."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    if module_name not in sys.modules:
        mod = types.ModuleType(module_name)
        setattr(mod, name, make_class())
        sys.modules[module_name] = mod
    by_name, by_path = {"type": name}, {"type": name, "module_path": module_name}
    if name in SecondaryTierFactory._registry:  # registered by an earlier run of this process
        return by_name
    try:  # 0.25.0 - 0.27.0 have get_tier_class, reading the registry only (0.25.0 tiering/factory.py:45-54),
        # and pass every other key of the config to the tier's constructor, module_path too (:28-41)
        SecondaryTierFactory.get_tier_class(by_path)
        return by_path
    except (AttributeError, ValueError):
        SecondaryTierFactory.register_tier(name, module_name, name)
        return by_name
