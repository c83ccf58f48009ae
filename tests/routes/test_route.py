from __future__ import annotations

import pytest

from routetune.errors import UsageError
from routetune.routes.route import Route, Step, parse_route


@pytest.mark.parametrize(
    "text",
    [
        "base",
        "fold-constants",
        "fold-constants,fuse-bn-into-conv,ort-opt-level{level=basic}",
        "fp16{data_max=512.0,keep_io_types=true,op_types_to_exclude=[Softmax,Pow]}",
        'x{name="two words",n=-3,r=1e-05,e=[]}',
    ],
)
def test_canonical_text_round_trips(text: str) -> None:
    route = parse_route(text)
    assert parse_route(str(route)) == route
    assert str(parse_route(str(route))) == str(route)


def test_params_are_sorted_and_typed() -> None:
    route = parse_route("a{z=1,b=true,f=0.5,s=word,l=[1,2]}")
    assert route.steps == (Step("a", (("b", True), ("f", 0.5), ("l", (1, 2)), ("s", "word"),
                                      ("z", 1))),)
    assert str(route) == "a{b=true,f=0.5,l=[1,2],s=word,z=1}"


def test_base_route_is_empty() -> None:
    assert parse_route("") == Route() == parse_route(" base ")
    assert str(Route()) == "base"
    assert Route().is_base


def test_strings_that_look_like_numbers_are_quoted() -> None:
    route = Route((Step.of("a", {"s": "12"}),))
    assert str(route) == 'a{s="12"}'
    assert parse_route(str(route)) == route


@pytest.mark.parametrize(
    ("text", "where"),
    [("a{x}", "expected '='"), ("a{x=1", "expected ',' or '}'"), ("a,,b", "expected a name"),
     ("a{x=1,x=2}", "given twice"), ("a b", "unexpected 'b'"), ('a{x="open}', "bad quoted")],
)
def test_bad_text_says_where(text: str, where: str) -> None:
    with pytest.raises(UsageError, match=where):
        parse_route(text)
