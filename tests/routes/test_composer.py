from __future__ import annotations

import pytest

from routetune.errors import UsageError
from routetune.registry import Registry
from routetune.routes.composer import RouteSpace, resolve_route
from routetune.routes.route import parse_route
from routetune.seasoning import Param, PassResult, Seasoning, SeasoningInfo


def info(name: str, stage: str = "graph", **kw: object) -> SeasoningInfo:
    return SeasoningInfo(name=name, stage=stage, summary=name, **kw)


def texts(space: RouteSpace) -> list[str]:
    return [str(r) for r in space.routes()]


def test_two_unordered_graph_seasonings_are_tried_both_ways() -> None:
    space = RouteSpace([info("a"), info("b")])
    assert texts(space) == ["base", "a", "b", "a,b", "b,a"]
    assert space.size() == 5


def test_declared_order_keeps_one_ordering() -> None:
    space = RouteSpace([info("a", after=frozenset({"b"})), info("b")])
    assert texts(space) == ["base", "a", "b", "b,a"]


def test_before_is_the_mirror_of_after() -> None:
    space = RouteSpace([info("a", before=frozenset({"b"})), info("b")])
    assert texts(space) == ["base", "a", "b", "a,b"]


def test_build_seasonings_commute_and_stages_run_in_order() -> None:
    space = RouteSpace([info("z", "build"), info("y", "build"), info("p", "precision"),
                        info("g", "graph")])
    routes = texts(space)
    assert "g,p,y,z" in routes
    assert "y,z" in routes and "z,y" not in routes
    assert all(r.index("g") < r.index("p") for r in routes if "g" in r and "p" in r)
    # subsets of 4 commuting-or-staged seasonings: 2^4, one ordering each
    assert space.size() == len(routes) == 16


def test_parameter_choices_multiply() -> None:
    space = RouteSpace([
        info("a", params=(Param("x", (1, 2, 3), 1),)),
        info("b", "build", params=(Param("m", ("p", "q"), "p"), Param("n", (True, False), True))),
    ])
    # base + a(3) + b(2*2) + a,b (3*4)
    assert space.size() == 1 + 3 + 4 + 12
    assert texts(space)[:4] == ["base", "a", "a{x=2}", "a{x=3}"]  # defaults are left out
    assert "a{x=3},b{m=q,n=false}" in texts(space)
    assert "a,b" in texts(space)


def test_requires_and_conflicts_prune() -> None:
    space = RouteSpace([
        info("a", requires=frozenset({"b"})), info("b"), info("c", conflicts=frozenset({"b"})),
    ])
    routes = texts(space)
    assert routes == ["base", "b", "c", "a,b", "b,a"]
    assert space.size() == 5


def test_max_depth_limits_route_length() -> None:
    space = RouteSpace([info(n, "build") for n in "abcd"], max_depth=2)
    assert space.size() == 1 + 4 + 6
    assert max(len(r) for r in space.routes()) == 2


def test_composer_is_deterministic_whatever_the_input_order() -> None:
    items = [info("c"), info("a", after=frozenset({"c"})), info("b", "build")]
    assert texts(RouteSpace(items)) == texts(RouteSpace(list(reversed(items))))


def test_extensions_keep_existing_order_and_add_requires() -> None:
    space = RouteSpace([info("a"), info("b"), info("c", "build", requires=frozenset({"b"}))])
    grown = sorted(str(r) for r in space.extensions(parse_route("a")))
    assert grown == ["a,b", "a,b,c", "b,a", "b,a,c"]
    assert all(str(r).count("a") == 1 for r in space.extensions(parse_route("a")))


def test_extensions_stop_at_max_depth() -> None:
    space = RouteSpace([info("a"), info("b")], max_depth=1)
    assert space.extensions(parse_route("a")) == []


def test_every_route_of_the_space_is_reachable_by_extensions() -> None:
    space = RouteSpace([info("a", params=(Param("x", (1, 2), 1),)), info("b"),
                        info("c", "build")])
    reached, frontier = {parse_route("base")}, [parse_route("base")]
    while frontier:
        frontier = [e for r in frontier for e in space.extensions(r) if e not in reached]
        reached.update(frontier)
    assert reached == set(space.routes())


class _A(Seasoning):
    info = info("a", params=(Param("x", (1, 2), 1),))

    def apply(self, state, ctx):  # noqa: ANN001, ANN201
        return PassResult(False)


class _B(Seasoning):
    info = info("b", "build", after=frozenset({"a"}), conflicts=frozenset({"c"}))


class _C(Seasoning):
    info = info("c", "build")


@pytest.fixture
def small_registry() -> Registry:
    registry = Registry()
    for cls in (_A, _B, _C):
        registry.add_seasoning(cls)
    return registry


def test_resolve_gives_the_canonical_form(small_registry: Registry) -> None:
    assert str(resolve_route(parse_route("a{x=1},b"), small_registry)) == "a,b"
    assert str(resolve_route(parse_route("a{x=2},b"), small_registry)) == "a{x=2},b"


@pytest.mark.parametrize(
    ("text", "message"),
    [("nope", "unknown seasoning 'nope'"), ("a{y=1}", "no parameter 'y'"),
     ("a{x=word}", "expected int"), ("b,a", "stages run graph, precision, build"),
     ("b,c", "conflicts with c"), ("a,a", "appears twice")],
)
def test_resolve_rejects_bad_routes(small_registry: Registry, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolve_route(parse_route(text), small_registry)


def test_pin_only_values_are_accepted_but_not_enumerated() -> None:
    p = Param("calibration", ("minmax",), "minmax", allowed=("entropy",))
    assert p.check("entropy") == "entropy"
    with pytest.raises(UsageError, match="not one of minmax|entropy"):
        p.check("entropopy")
    space = RouteSpace([info("q", params=(p,))])
    assert texts(space) == ["base", "q"]
