from __future__ import annotations

from kvscope.events import FIELDS, schema


def test_column_constants_name_every_field_at_its_position():
    cols = {name: value for name, value in vars(schema).items() if name.startswith("COL_")}
    assert sorted(cols.values()) == list(range(len(FIELDS)))
    for name, value in cols.items():
        assert name == "COL_" + FIELDS[value].upper(), name


def test_raw_row_is_seq_time_iteration_then_the_canonical_fields_from_request_id():
    assert schema.RAW_FIELDS[: schema.RAW_REQUEST_ID] == ("seq", "ts_ns", "iteration")
    assert schema.RAW_FIELDS[schema.RAW_REQUEST_ID:] == FIELDS[schema.COL_REQUEST_ID:]
    assert (schema.RAW_SEQ, schema.RAW_TS_NS, schema.RAW_ITERATION) == (0, 1, 2)
