"""The seam table is chosen by the methods the engine's ``KVCacheManagerV2`` has, not by its module path."""

from __future__ import annotations

import pytest

from kvscope.engines.trtllm.seams import MGR_NEW, MGR_OLD, SEAMS_BY_VERSION, choose_table


class _Rc25:
    def _prepare_draft_resources(self, scheduled_batch): ...
    def resize_context(self, req, num_tokens): ...


class _Rc27(_Rc25):
    def prepare_context_cache(self, req, reuse_limit=None): ...
    def try_allocate_draft_context(self, req, num_tokens): ...


class _Main(_Rc27):
    def admit_mirror(self, req): ...

    @property
    def has_cache_tier_below_gpu(self):
        return False


@pytest.mark.parametrize("module", [MGR_OLD, MGR_NEW])
@pytest.mark.parametrize(("cls", "table"), [(_Rc25, "1.3.0rc25"), (_Rc27, "1.3.0rc27"), (_Main, "main-00746ef")])
def test_table_follows_the_methods_whatever_the_module_path(cls, table, module):
    choice = choose_table(cls, module=module)
    assert choice.table == table
    assert choice.table in SEAMS_BY_VERSION
    assert module in choice.reason


def test_reason_names_the_methods_that_decided():
    assert choose_table(_Main).reason == "_Main has admit_mirror and has_cache_tier_below_gpu"
    assert choose_table(_Rc27).reason == "_Rc27 has prepare_context_cache and try_allocate_draft_context"
    assert choose_table(_Rc25).reason == ("_Rc25 has none of admit_mirror, has_cache_tier_below_gpu, "
                                          "prepare_context_cache, try_allocate_draft_context (no joint reuse)")


def test_a_build_with_admit_mirror_but_no_tier_query_is_not_taken_for_main():
    class _Partial(_Rc27):
        def admit_mirror(self, req): ...

    assert choose_table(_Partial).table == "1.3.0rc27"


def test_rc27_table_has_joint_reuse_seams_and_no_admit_mirror():
    rc27 = {s.qualname for s in SEAMS_BY_VERSION["1.3.0rc27"]}
    assert "KVCacheManagerV2.prepare_context_cache" in rc27
    assert "KVCacheManagerV2.admit_mirror" not in rc27
    assert {s.module for s in SEAMS_BY_VERSION["1.3.0rc27"] if s.qualname.startswith("KVCacheManagerV2.")} == {
        MGR_NEW}
