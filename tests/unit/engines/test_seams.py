from __future__ import annotations

import pytest

from kvscope.engines.seams import MismatchKind, Seam, check_seams, parse_parameters, seam_results

COMMIT = "0004396720054fd8e205cbf616f21f0b57c6b412"


class KVCacheManagerV2:
    def resize_context(self, req, num_tokens):
        return True

    def free_resources(self, request, pin_on_release=False):
        return None

    @property
    def has_cache_tier_below_gpu(self):
        return False


def _seam(qualname: str, signature: str, module: str = __name__) -> Seam:
    return Seam(module, qualname, signature, COMMIT)


def test_matching_class_gives_no_mismatch_when_names_and_kinds_agree():
    seams = [_seam("KVCacheManagerV2.resize_context", "(self, req, num_tokens)"),
             _seam("KVCacheManagerV2.free_resources", "(self, request, pin_on_release=False)"),
             _seam("KVCacheManagerV2.has_cache_tier_below_gpu", "property")]
    assert check_seams(seams) == []
    assert check_seams(seams, classes={"KVCacheManagerV2": KVCacheManagerV2}) == []


def test_each_difference_is_reported_in_plain_words_when_classes_differ():
    seams = [_seam("KVCacheManagerV2.resize_context", "(self, req, num_tokens, extra)"),
             _seam("KVCacheManagerV2.admit_mirror", "(self, req)"),
             _seam("KVCacheV2Scheduler.schedule_request", "(self, active_requests, inflight_request_ids)"),
             _seam("KVCacheManagerV2.resize_context", "(self, req)", module="kvscope_no_such_module_xyz")]
    found = check_seams(seams)
    assert [m.kind for m in found] == [MismatchKind.CHANGED_PARAMETERS, MismatchKind.MISSING_METHOD,
                                       MismatchKind.MISSING_CLASS, MismatchKind.MISSING_MODULE]
    assert found[0].detail == ("parameters changed: recorded (self, req, num_tokens, extra) at 00043967, "
                               "found (self, req, num_tokens)")
    assert found[1].detail == "method admit_mirror not found on KVCacheManagerV2"
    assert found[2].detail == "class KVCacheV2Scheduler not found"
    assert found[3].detail.startswith("module kvscope_no_such_module_xyz cannot be imported")
    assert str(found[1]).startswith("KVCacheManagerV2.admit_mirror (")


def test_keyword_only_change_is_a_changed_parameter_when_kind_differs():
    results = seam_results([_seam("KVCacheManagerV2.free_resources", "(self, request, *, pin_on_release=False)")])
    assert not results[0].ok
    assert results[0].mismatch.kind is MismatchKind.CHANGED_PARAMETERS


def test_parse_parameters_keeps_names_order_and_kinds_when_given_varargs():
    assert parse_parameters("(self, a, *args, b=1, **kw)") == (
        ("self", "positional"), ("a", "positional"), ("args", "*args"), ("b", "keyword"), ("kw", "**kwargs"))


def test_seam_rejects_an_abbreviated_commit_when_constructed():
    with pytest.raises(ValueError, match="40 lower-case hex"):
        Seam("m", "C.f", "(self)", "0004396")
    with pytest.raises(ValueError, match="Class.method"):
        Seam("m", "f", "(self)", COMMIT)
