"""What the standalone reproducers in scripts/ share beyond the side package's vLLM adapter
(each runs in a release's import venv, without kvbound): the side package loaded by path,
and a minimal KV connector whose worker side does nothing.

A reproducer run as ``python scripts/repro_X.py`` has scripts/ first on ``sys.path``, so
``import repro_support`` finds this file; ``side_package()`` then makes ``kvbound/side/``
importable as ``kvbound_side`` (``kvbound_side.adapter`` boots vLLM on CPU: the einops
stub, hashing, the local model, the specs and the ``KVCacheConfig``).
"""

import os
import sys
import types

MODULE = "kvbound_repro_connector"  # the kv_connector_module_path the connector is installed as
SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kvbound", "side")


def side_package():
    """``kvbound/side`` as the package ``kvbound_side`` (its entry script registers it)."""
    sys.path.insert(0, SIDE)
    try:
        import worker  # noqa: F401
    finally:
        sys.path.remove(SIDE)
    return sys.modules["kvbound_side"]


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
