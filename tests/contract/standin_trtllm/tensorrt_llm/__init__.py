"""Stand-in ``tensorrt_llm`` (kvscope tests): see ../README.md."""

__version__ = "1.3.0+kvscope-standin"
