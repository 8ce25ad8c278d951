"""kvscope's accounting-only stand-in for ``cuda.bindings`` (decisions-only mode on a machine without a GPU).

Put on ``sys.path`` by ``kvscope.engines.trtllm.installed`` only when ``kvscope replay --manager
installed`` runs where no CUDA device answers. It answers the driver calls TensorRT-LLM's KV cache
manager V2 runtime makes (virtual-memory bookkeeping, streams and events) so that the runtime makes
its allocation decisions; no byte of KV data exists.
"""

__version__ = "0.0+kvscope-accounting-standin"
