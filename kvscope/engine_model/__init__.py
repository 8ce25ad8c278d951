"""CPU model of TensorRT-LLM's KV cache manager V2, its V2 scheduler and executor loop.

Imports nothing from kvscope: observing the model is the binding's job. See SOURCES.md for the real
file and commit each modelled behaviour was read at.
"""
