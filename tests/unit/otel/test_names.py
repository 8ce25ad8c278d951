"""The names table: one place, kvscope.* names, UCUM units, Prometheus names."""

from __future__ import annotations

import re

from kvscope.otel import names as n

UCUM = re.compile(r"^(s|1|By|\{[a-z]+\})$")


def test_every_metric_is_prefixed_unique_and_has_ucum_unit_when_listed():
    names = [m.name for m in n.METRICS]
    assert len(names) == len(set(names))
    for m in n.METRICS:
        assert m.name.startswith("kvscope."), m.name
        assert UCUM.match(m.unit), (m.name, m.unit)
        assert m.description


def test_prometheus_names_follow_otlp_translation_when_derived():
    assert n.prometheus_name(n.POOL_BLOCKS_USED) == "kvscope_pool_blocks_used"
    assert n.prometheus_name(n.BLOCKS_ALLOCATED) == "kvscope_pool_blocks_allocated_total"
    assert n.prometheus_name(n.ADMISSION_WAIT) == "kvscope_admission_wait_seconds"
    assert n.prometheus_name(n.POOL_UTILIZATION) == "kvscope_pool_utilization_ratio"
    assert n.prometheus_name(n.TIME_TO_EXHAUSTION) == "kvscope_analysis_time_to_exhaustion_seconds"


def test_only_genai_defined_attributes_use_the_gen_ai_prefix_when_declared():
    gen_ai = {v for k, v in vars(n).items() if isinstance(v, str) and v.startswith("gen_ai.")}
    assert gen_ai == {
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.request.max_tokens",
    }


def test_markdown_table_lists_every_metric_when_rendered():
    table = n.markdown_table()
    for m in n.METRICS:
        assert f"`{m.name}`" in table and f"`{n.prometheus_name(m)}`" in table
    assert len(table.splitlines()) == len(n.METRICS) + 2


def test_docs_show_the_current_metric_table_when_names_change():
    from pathlib import Path

    otel_doc = (Path(__file__).resolve().parents[3] / "docs" / "otel.md").read_text()
    assert n.markdown_table() in otel_doc
