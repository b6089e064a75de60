"""Optimization profiles derived from the ONNX's dims, its export metadata and the requested ranges."""

from __future__ import annotations

import pytest

from attnres_export.backends.tensorrt.profiles import derive_profile
from attnres_export.dims import DimRange
from attnres_export.errors import EngineError
from tests.backends.tensorrt.graphs import token_model


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
