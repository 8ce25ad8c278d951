"""The TensorRT-LLM side of the binding. ``tensorrt_llm`` is imported lazily, only in this package."""
