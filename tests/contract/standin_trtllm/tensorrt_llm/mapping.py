"""Stand-in ``tensorrt_llm.mapping``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Mapping:
    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
