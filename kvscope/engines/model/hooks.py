"""Model-only seams on ``PyExecutorModel`` (no TensorRT-LLM counterpart is wrapped).

* ``_fetch_and_activate_new_requests``: the iteration number. The model's decode fast-forward skips
  iterations without scheduling them, so the event file takes the executor's own ``iter_counter``
  (the real loop's numbering) instead of counting schedule calls.
* ``add_request``: REQUEST_ARRIVED at arrival (the real binding sees a request first in
  ``schedule_request``) and ADMISSION_REJECTED for a prompt longer than ``max_seq_len``, which the
  executor refuses before any scheduler sees it.
"""

from __future__ import annotations

from kvscope.engines.binding import Binding
from kvscope.engines.hooks import Wrapper
from kvscope.events import EventKind, PoolRole


def fetch_and_activate(b: Binding) -> Wrapper:
    rec = b.rec

    def wrapper(wrapped, instance, args, kwargs):
        if rec.enabled:
            try:
                rec.iteration = b.iteration_hint = int(instance.iter_counter)
            except Exception:
                b.hook_failed()
        return wrapped(*args, **kwargs)

    return wrapper


def add_request(b: Binding) -> Wrapper:
    rec = b.rec

    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        if rec.enabled:
            try:
                if result is not None:
                    b.arrive(result)
                else:
                    arrival = args[0] if args else kwargs["arrival"]
                    rid = int(arrival.request_id)
                    b.arrived.add(rid)
                    rec.record(EventKind.REQUEST_ARRIVED, rid, PoolRole.NONE, int(arrival.output_len),
                               int(arrival.prompt_len))
                    rec.record(EventKind.ADMISSION_REJECTED, rid, PoolRole.NONE, 0, int(arrival.prompt_len),
                               reason=f"prompt_len {arrival.prompt_len} > max_seq_len {instance.config.max_seq_len}")
            except Exception:
                b.hook_failed()
        return result

    return wrapper


MODEL_ONLY_HOOKS = {
    "_fetch_and_activate_new_requests": fetch_and_activate,
    "add_request": add_request,
}
"""PyExecutorModel method -> wrapper factory."""
