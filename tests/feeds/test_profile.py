"""Optimisation profiles: trtexec's --shapes/--min-shapes/--opt-shapes/--max-shapes."""

from __future__ import annotations

import numpy as np
import pytest

from routetune.errors import UsageError
from routetune.feeds.inputs import parse_shapes, resolve_shapes
from routetune.feeds.profile import ShapeProfile, make_profile
from routetune.model.loading import TensorSpec

SPECS = (TensorSpec("x", np.dtype(np.float32), ("N", 3, "H", "W")),
         TensorSpec("scale", np.dtype(np.float32), (1,)))


def profile(opt: str, low: str | None = None, high: str | None = None) -> ShapeProfile:
    return make_profile(SPECS, resolve_shapes(SPECS, parse_shapes(opt)), low, high)


def test_opt_alone_fixes_all_three_and_static_inputs_are_left_out() -> None:
    p = profile("x:2x3x48x192")
    assert p.shapes == {"x": ((2, 3, 48, 192),) * 3}
    assert str(p) == "x:2x3x48x192/2x3x48x192/2x3x48x192"
    assert ShapeProfile.parse(str(p)) == p


def test_min_and_max_bound_the_opt_shape() -> None:
    p = profile("x:2x3x48x192", "x:1x3x48x96", "x:8x3x48x960")
    assert p.shapes["x"] == ((1, 3, 48, 96), (2, 3, 48, 192), (8, 3, 48, 960))


@pytest.mark.parametrize(("low", "high", "message"), [
    ("x:4x3x48x192", None, "input 'x' dimension 0: min 4, opt 2, max 2 are not in order; "
                           "give --min-shapes <= --opt-shapes <= --max-shapes"),
    (None, "x:2x3x48x100", "input 'x' dimension 3: min 192, opt 192, max 100"),
    ("x:1x4x48x192", None, "--min-shapes: input 'x' dimension 1 is 4 but the model fixes it at 3"),
    (None, "y:1x3x48x192", "--max-shapes: the model has no input 'y'"),
    (None, "x:2x3x48", "--max-shapes: input 'x' has rank 4"),
])
def test_bad_bounds_name_the_input_and_dimension(low: str | None, high: str | None,
                                                 message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        profile("x:2x3x48x192", low, high)


def test_parse_refuses_garbage() -> None:
    with pytest.raises(UsageError, match="cannot read 'x:1x2'"):
        ShapeProfile.parse("x:1x2")
