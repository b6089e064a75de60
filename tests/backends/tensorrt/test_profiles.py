"""Optimization profiles derived from the ONNX's dims, its export metadata and the requested ranges."""

from __future__ import annotations

import re

import pytest

from attnres_export.backends.tensorrt.profiles import derive_profile
from attnres_export.dims import DimRange
from attnres_export.errors import EngineError
from tests.backends.tensorrt.graphs import past_model, token_model


def test_profile_defaults_to_the_exported_ranges():
    profile = derive_profile(token_model())
    (ids,) = profile.inputs
    assert (ids.name, ids.min, ids.opt, ids.max) == ("input_ids", (1, 1), (2, 16), (8, 64))
    assert profile.dims == {"batch": DimRange(1, 2, 8), "seq": DimRange(1, 16, 64)}
    assert profile.axes == {"input_ids": ["batch", "seq"]}


def test_requested_range_inside_the_export_overrides_one_dim():
    profile = derive_profile(token_model(), {"batch": DimRange(2, 4, 4), "seq": None})
    assert profile.to_dict() == {"input_ids": {"min": [2, 1], "opt": [4, 16], "max": [4, 64]}}


@pytest.mark.parametrize("ranges", [{"seq": DimRange(1, 16, 128)}, {"batch": DimRange(1, 1, 9)}])
def test_range_outside_the_exported_dims_is_refused(ranges):
    with pytest.raises(EngineError, match="outside the exported"):
        derive_profile(token_model(), ranges)


def test_static_dim_takes_its_own_size_and_refuses_a_range():
    model = token_model(dims={"seq": [1, 16, 64]}, batch=2)
    profile = derive_profile(model)
    assert profile.inputs[0].min == (2, 1) and profile.inputs[0].max == (2, 64)
    assert derive_profile(model, {"batch": DimRange(2, 2, 2)}).inputs[0].opt == (2, 16)
    with pytest.raises(EngineError, match="static batch of 2"):
        derive_profile(model, {"batch": DimRange(1, 2, 4)})


def test_dynamic_dim_without_recorded_range_needs_one():
    model = token_model(with_metadata=False)
    with pytest.raises(EngineError, match="pass --batch MIN:OPT:MAX"):
        derive_profile(model)
    profile = derive_profile(model, {"batch": DimRange(1, 1, 2), "seq": DimRange(1, 4, 8)})
    assert profile.inputs[0].max == (2, 8)


def test_range_for_a_dim_the_onnx_lacks_is_refused():
    with pytest.raises(EngineError, match="no dynamic dim named 'tokens'"):
        derive_profile(token_model(), {"tokens": DimRange(1, 1, 1)})


def shapes(profile, name: str) -> tuple:
    (entry,) = [i for i in profile.inputs if i.name == name]
    return entry.min, entry.opt, entry.max


def test_with_past_profile_defaults_to_the_exported_ranges_of_all_four_dims():
    profile = derive_profile(past_model())
    assert shapes(profile, "past_key_values.0.key") == ((1, 2, 0, 4), (1, 2, 8, 4), (4, 2, 15, 4))
    assert shapes(profile, "attention_mask") == ((1, 1), (1, 9), (4, 16))
    assert profile.dims["total"] == DimRange(1, 9, 16)


@pytest.mark.parametrize(("past", "seq", "total"), [
    (DimRange(0, 2, 5), None, DimRange(1, 3, 16)),  # past narrowed: the mask follows, its max clipped to 16
    (DimRange(3, 4, 7), DimRange(1, 1, 1), DimRange(4, 5, 8)),  # decode-only: one new token after 3..7
    (DimRange(0, 0, 0), DimRange(2, 5, 9), DimRange(2, 5, 9)),  # prefill-only: no past at all
    (DimRange(1, 1, 1), DimRange(1, 1, 1), DimRange(2, 2, 2)),  # a single shape
])
def test_narrowed_past_or_seq_narrows_the_mask_to_past_plus_seq(past, seq, total):
    profile = derive_profile(past_model(), {"past": past, "seq": seq})
    assert profile.dims["total"] == total
    assert shapes(profile, "attention_mask") == ((1, total.min), (1, total.opt), (4, total.max))
    past = past or DimRange(0, 8, 15)
    assert shapes(profile, "past_key_values.0.key") == ((1, 2, past.min, 4), (1, 2, past.opt, 4),
                                                        (4, 2, past.max, 4))


@pytest.mark.parametrize(("ranges", "what"), [
    ({"past": DimRange(0, 12, 15), "seq": DimRange(1, 8, 16)}, "OPT past + OPT seq is 20"),
    ({"past": DimRange(0, 1, 15), "seq": DimRange(2, 2, 16)}, "MAX past + MIN seq is 17"),
])
def test_past_and_seq_ranges_that_cannot_fit_the_exported_total_are_refused_in_one_line(ranges, what):
    with pytest.raises(EngineError, match=re.escape(f"{what}, over the exported total max 16")) as err:
        derive_profile(past_model(), ranges)
    assert "\n" not in str(err.value)


def test_a_past_range_outside_the_export_is_refused_naming_past_not_the_mask():
    with pytest.raises(EngineError, match=r"^--past 0:8:20 is outside the exported past range 0:8:15"):
        derive_profile(past_model(), {"past": DimRange(0, 8, 20)})


def test_total_is_derived_never_requested():
    with pytest.raises(EngineError, match="total is past \\+ seq, derived from their ranges; pass --past or --seq"):
        derive_profile(past_model(), {"total": DimRange(1, 2, 3)})


def test_past_range_for_an_onnx_without_a_past_dim_is_refused():
    with pytest.raises(EngineError, match="no dynamic dim named 'past'"):
        derive_profile(token_model(), {"past": DimRange(0, 1, 2)})
