"""What the standalone reproducers in scripts/ share (each runs in a release's import venv,
without kvbound): vLLM imported on CPU, a local model config with a registered model class
that is never built, and a minimal KV connector whose worker side does nothing.

A reproducer run as ``python scripts/repro_X.py`` has scripts/ first on ``sys.path``, so
``import repro_support`` finds this file.
"""

import json
import os
import sys
import tempfile
import types

MODULE = "kvbound_repro_connector"  # the kv_connector_module_path the connector is installed as


def import_vllm_on_cpu():
    """0.29+'s import chain reaches vit_attn_wrappers, which imports einops (never called)."""
    try:
        import einops  # noqa: F401
    except ImportError:
        sys.modules["einops"] = types.ModuleType("einops")


def model_dir(num_hidden_layers, vocab_size, max_position_embeddings):
    """A local Llama config.json (no Hugging Face hub), in a fresh temporary directory."""
    d = tempfile.mkdtemp(prefix="repro-model-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": num_hidden_layers, "vocab_size": vocab_size,
                   "max_position_embeddings": max_position_embeddings,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    return d


def register_model():
    """The config's architecture, as a class vLLM only inspects."""
    import torch.nn as nn
    from vllm import ModelRegistry

    class NeverBuilt(nn.Module):  # only its interface is inspected
        def __init__(self, *, vllm_config, prefix=""):
            super().__init__()

        def embed_input_ids(self, input_ids):
            raise NotImplementedError

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
            raise NotImplementedError

        def compute_logits(self, hidden_states):
            raise NotImplementedError

    ModelRegistry.register_model("LlamaForCausalLM", NeverBuilt)


def idle_connector_base(*mixins):
    """``KVConnectorBase_V1`` (and ``mixins``) with a scheduler side that records nothing and a
    worker side that moves nothing; a reproducer adds its ``get_num_new_matched_tokens``."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

    class IdleConnector(KVConnectorBase_V1, *mixins):
        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            pass

        def build_connector_meta(self, scheduler_output):
            return KVConnectorMetadata()

        def start_load_kv(self, forward_context, **kwargs):
            pass

        def wait_for_layer_load(self, layer_name):
            pass

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            pass

        def wait_for_save(self):
            pass

    return IdleConnector


def install_connector(cls):
    """``cls`` importable as ``MODULE.<its name>`` (KVTransferConfig's kv_connector_module_path)."""
    mod = types.ModuleType(MODULE)
    setattr(mod, cls.__name__, cls)
    sys.modules[MODULE] = mod
