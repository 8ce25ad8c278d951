"""The forward step's KV side and its error path: page-table copies, ``_handle_errors``, "Sampling failed".

Stands for, in ``NVIDIA/TensorRT-LLM`` @ 0004396720054fd8e205cbf616f21f0b57c6b412:

- ``PyExecutor._forward_step`` (``py_executor.py``): ``model_engine.forward(...)`` inside
  ``try``; any exception is logged ("Encountered an error in forward function: ..."), handed to
  ``_handle_errors(error_msg)`` (no request list: EVERY active request gets the error response and
  is terminated, its resources freed) and the step returns None instead of outputs;
- the KV side of ``model_engine.forward``: ``TrtllmAttentionMetadata.prepare()``
  (``_torch/attention_backend/trtllm.py``, stored versions read via the index) copies the batch's
  page tables, first ``kv_cache_manager.copy_batch_block_offsets(kv_cache_block_offsets,
  request_ids, beam_width, num_contexts, num_seqs)`` and then, when a one-model draft manager
  exists, ``draft_kv_cache_manager.copy_batch_block_offsets(...)`` with the SAME request ids. A
  request whose draft mirror ``_prepare_draft_resources`` skipped (draft IndexMapper full) has no
  draft slot, so the C++ ``IndexMapper::getIndex`` check fails here;
- ``_executor_loop_overlap``: ``_sample_async(batch, None)`` returns None and the loop's
  ``assert sample_state is not None, "Sampling failed"`` (outside the forward's ``try``) raises, so
  the exception that reaches ``_event_loop_wrapper`` is that ``AssertionError``: the loop ends like
  every other fatal site.

``_handle_errors`` charges the error budget (``error_budget.py``): the IndexMapper text is a
"transient" error (no fatal pattern), so by itself it fails the active requests without shutting
down; the "Sampling failed" assertion then ends the loop in the same iteration. The non-overlap
``_executor_loop`` and ``_executor_loop_pp`` bodies were not re-read for this (the overlap loop is
the default).

The model has no tensors: ``dst_tensor`` is None and the copy returns the slot indices.
"""

from __future__ import annotations

import logging
from typing import Any

from .resource_manager import ResourceManagerType

logger = logging.getLogger(__name__)

SAMPLING_FAILED = "Sampling failed"


def copy_block_offsets(resource_manager: Any, batch: Any) -> None:
    """``TrtllmAttentionMetadata.prepare()``'s page-table copies: target, then draft (same ids).

    Raises whatever a manager's ``copy_batch_block_offsets`` raises (an unmapped id).
    """
    request_ids = [r.py_request_id for r in batch.context_requests]
    num_contexts = len(request_ids)
    request_ids.extend(r.py_request_id for r in batch.generation_requests)
    if not request_ids:
        return
    num_seqs = len(request_ids)
    for kind in (ResourceManagerType.KV_CACHE_MANAGER, ResourceManagerType.DRAFT_KV_CACHE_MANAGER):
        manager = resource_manager.get_resource_manager(kind)
        if manager is not None:
            manager.copy_batch_block_offsets(None, request_ids, 1, num_contexts, num_seqs)


def forward_step(executor: Any, batch: Any) -> bool:
    """``PyExecutor._forward_step``: True with outputs, False when the forward failed (error handled).

    Mutates: on failure, ``executor.forward_error`` and (through ``executor._handle_errors``) every
    active request.
    """
    try:
        copy_block_offsets(executor.resource_manager, batch)
        replica = getattr(executor, "stage_replica", None)
        if replica is not None:
            copy_block_offsets(replica.resource_manager, batch)  # the last stage's own page tables
    except Exception as exc:  # noqa: BLE001 - the real _forward_step catches Exception
        logger.error("Encountered an error in forward function: %s", exc)
        executor.forward_error = exc
        executor._handle_errors(str(exc))
        return False
    return True

