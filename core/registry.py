"""The registry that plugins fill: seasonings, backends, search strategies, metrics."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from routetune.errors import PluginError, UsageError, one_line
from routetune.seasoning import Seasoning

if TYPE_CHECKING:
    import pluggy

    from routetune.backend import Backend
    from routetune.execution.executor import Executor
    from routetune.judging.metrics import AnyMetric
    from routetune.search.strategy import Strategy

logger = logging.getLogger(__name__)

T = TypeVar("T")

REGISTRATION_HOOKS = (
    ("routetune_register_seasonings", "seasonings"),
    ("routetune_register_backends", "backends"),
    ("routetune_register_strategies", "search strategies"),
    ("routetune_register_metrics", "metrics"),
    ("routetune_register_executors", "executors"),
)
"""The registration hooks (`routetune.hookspecs`), in call order, with what each adds."""


class Entry(Generic[T]):
    """One registered item and the plugin (entry-point name) that registered it.

    A lazy entry (`Registry.add_lazy_seasoning`) makes its item on first use of `item`.

    Args:
        item: The item; None for a lazy entry.
        plugin: The plugin's entry-point name.
        make: Makes the item of a lazy entry.
        backends: A lazy seasoning's backends, declared before it is made.
    """

    def __init__(self, item: T | None, plugin: str, make: Callable[[], T] | None = None,
                 backends: frozenset[str] = frozenset()) -> None:
        self._item = item
        self.plugin = plugin
        self._make = make
        self._backends = backends

    @property
    def made(self) -> bool:
        """Whether the item exists (always, unless the entry is lazy and unused)."""
        return self._item is not None

    @property
    def item(self) -> T:
        """The item, made now if the entry is lazy (`Registry.add_lazy_seasoning`)."""
        if self._item is None:
            assert self._make is not None
            self._item = self._make()
        return self._item


class Registry:
    """Everything the installed plugins registered, sorted by name.

    Plugins call the ``add_*`` methods from their registration hooks. Lookups raise
    `UsageError` naming the known items, since a name usually comes from the user.
    """

    def __init__(self) -> None:
        self.seasonings: dict[str, Entry[type[Seasoning]]] = {}
        self.backends: dict[str, Entry[type[Backend]]] = {}
        self.strategies: dict[str, Entry[type[Strategy]]] = {}
        self.metrics: dict[str, Entry[AnyMetric]] = {}
        self.executors: dict[str, Entry[type[Executor]]] = {}
        self.plugins: dict[str, str] = {}
        self.reference: str | None = None
        """The backend that computes FP32 reference outputs (`add_backend`), by name."""
        self._current = "<direct>"

    @classmethod
    def from_plugin_manager(cls, pm: pluggy.PluginManager, dists: dict[str, str]) -> Registry:
        """Call every registration hook of `pm`, one plugin at a time, and validate.

        Each plugin's hook is called through pluggy's own hook caller (a subset caller
        holding that plugin alone), so pluggy's tracing and hook-call monitoring see
        every call, and what a plugin registers, or raises, is attributed to it.

        Args:
            pm: A plugin manager from `routetune.plugins.get_plugin_manager`.
            dists: Plugin name to ``"distribution version"``, for introspection.

        Raises:
            PluginError: Two plugins registered one name, a plugin's hook raised (one
                line naming the plugin, its distribution and the exception), or an
                ordering cycle.
        """
        registry = cls()
        for hook_name, what in REGISTRATION_HOOKS:
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                name = impl.plugin_name
                others = [p for p in pm.get_plugins() if p is not impl.plugin]
                registry._current = name
                registry.plugins.setdefault(name, dists.get(name, "?"))
                try:
                    pm.subset_hook_caller(hook_name, remove_plugins=others)(registry=registry)
                except PluginError:
                    raise
                except Exception as e:  # a bug in the plugin: named, one line
                    raise PluginError(
                        f"plugin '{name}' ({dists.get(name, '?')}) failed while registering "
                        f"its {what}: {type(e).__name__}: {one_line(e, 200)}; disable it "
                        f"with ROUTETUNE_DISABLE_PLUGINS={name}") from e
        registry._current = "<direct>"
        registry.validate()
        return registry

    def _add(self, table: dict[str, Entry[Any]], kind: str, name: str, item: Any) -> None:
        if name in table:
            raise PluginError(
                f"{kind} '{name}' is registered by both plugin '{table[name].plugin}' "
                f"and plugin '{self._current}'; disable one with ROUTETUNE_DISABLE_PLUGINS"
            )
        table[name] = Entry(item, self._current)
        self.plugins.setdefault(self._current, "?")

    def added(self) -> list[str]:
        """Items registered directly in this process, not by an entry-point plugin.

        A worker process loads plugins from entry points only, so it cannot see these
        (strategies run in the search's own process and are not listed).
        """
        tables = (self.seasonings, self.backends, self.metrics)
        return sorted(name for table in tables for name, entry in table.items()
                      if entry.plugin == "<direct>")

    def add_seasoning(self, cls: type[Seasoning]) -> None:
        """Register a seasoning class.

        Raises:
            PluginError: Not a `Seasoning` subclass with an ``info``, or a duplicate name.
        """
        if not (isinstance(cls, type) and issubclass(cls, Seasoning)) or not hasattr(cls, "info"):
            raise PluginError(
                f"plugin '{self._current}' registered {cls!r}, which is not a Seasoning "
                "subclass with an info attribute"
            )
        self._add(self.seasonings, "seasoning", cls.info.name, cls)

    def add_lazy_seasoning(self, name: str, backends: Iterable[str],
                           make: Callable[[], type[Seasoning]]) -> None:
        """Register a seasoning whose class is made only when it is first used.

        For a seasoning whose parameters come from a vendor library that is slow to
        import (TensorRT's build-route knobs): a run on another backend, and its
        workers, never import it. Until made, only its name and backends are known;
        it may not declare ``requires``, ``conflicts``, ``after`` or ``before``.

        Args:
            name: The seasoning's name; the class made must have it.
            backends: The backends it is for (non-empty): it is made only for them, for
                a lookup by name, or for ``routetune seasonings``.
            make: Makes the `Seasoning` subclass.

        Raises:
            PluginError: A duplicate name, or no backends. When made: not a seasoning
                of this name and these backends, or one with ordering declarations.
        """
        declared = frozenset(backends)
        if not declared:
            raise PluginError(f"plugin '{self._current}': lazy seasoning '{name}' must name "
                              "its backends")
        plugin = self._current

        def checked() -> type[Seasoning]:
            cls = make()
            info = getattr(cls, "info", None)
            if not (isinstance(cls, type) and issubclass(cls, Seasoning)) or info is None or (
                    info.name, info.backends) != (name, declared) or (
                    info.requires | info.conflicts | info.after | info.before):
                raise PluginError(
                    f"plugin '{plugin}' made lazy seasoning '{name}' as {cls!r}, not a "
                    f"Seasoning named '{name}' for {', '.join(sorted(declared))} without "
                    "requires, conflicts, after or before")
            return cls

        if name in self.seasonings:
            self._add(self.seasonings, "seasoning", name, None)  # raises, naming both
        self.seasonings[name] = Entry(None, plugin, checked, declared)
        self.plugins.setdefault(plugin, "?")

    def offered_for(self, name: str, backend: str) -> bool:
        """Whether seasoning `name` is for `backend` (all backends when it names none).

        A lazy seasoning answers from its declared backends, without being made.
        """
        entry = self.seasonings[name]
        backends = entry._backends if not entry.made else entry.item.info.backends
        return not backends or backend in backends

    def add_backend(self, cls: type[Backend], reference: bool = False) -> None:
        """Register a backend class (its ``name`` is the ``--backend`` value).

        Args:
            cls: The `Backend` subclass.
            reference: It takes the FP32 reference role: it runs the original model in
                FP32 for the outputs every candidate is checked against
                (`Backend.reference`, `Backend.evaluate`). ONNX Runtime's CPU provider
                registers it; one backend may hold the role.

        Raises:
            PluginError: A duplicate name, or a second backend taking the reference role.
        """
        if reference and self.reference is not None:
            raise PluginError(
                f"backend '{cls.name}' of plugin '{self._current}' and backend "
                f"'{self.reference}' of plugin '{self.backends[self.reference].plugin}' both "
                "take the FP32 reference role; disable one with ROUTETUNE_DISABLE_PLUGINS")
        self._add(self.backends, "backend", cls.name, cls)
        if reference:
            self.reference = cls.name

    def reference_backend(self) -> type[Backend]:
        """The backend class holding the FP32 reference role.

        Raises:
            UsageError: No installed plugin registers one.
        """
        if self.reference is None:
            raise UsageError(
                "no backend takes the FP32 reference role that candidates are checked "
                "against (ONNX Runtime's CPU provider does, from the plugin 'onnxruntime'); "
                "take onnxruntime out of ROUTETUNE_DISABLE_PLUGINS, or install a plugin that "
                "registers one with add_backend(cls, reference=True)")
        return self.backends[self.reference].item

    def add_strategy(self, cls: type[Strategy]) -> None:
        """Register a search strategy class (its ``name`` is the ``--search`` value)."""
        self._add(self.strategies, "strategy", cls.name, cls)

    def add_metric(self, metric: AnyMetric) -> None:
        """Register an accuracy metric (its ``name`` is usable in ``--accuracy``).

        A `routetune.judging.metrics.Metric` compares two arrays; a
        `routetune.judging.metrics.TaskMetric` sees an output of every input set at once.
        """
        self._add(self.metrics, "metric", metric.name, metric)

    def add_executor(self, cls: type[Executor]) -> None:
        """Register an executor class (its ``name`` is the ``--executor`` value)."""
        self._add(self.executors, "executor", cls.name, cls)

    def validate(self) -> None:
        """Check the seasonings' constraint graph once, after registration.

        A reference to an unknown seasoning is logged (at INFO: it usually names a
        seasoning of a plugin that is not installed or is disabled). An ordering cycle raises.

        Raises:
            PluginError: The ``after``/``before`` declarations form a cycle.
        """
        infos = {name: e.item.info for name, e in self.seasonings.items()
                 if e.made}  # a lazy one declares no constraints (add_lazy_seasoning)
        edges: dict[str, set[str]] = {name: set() for name in infos}
        for name, info in infos.items():
            for other in info.requires | info.conflicts | info.after | info.before:
                if other not in self.seasonings:
                    logger.info("seasoning '%s' refers to unknown seasoning '%s'", name, other)
            for other in info.after:
                if other in infos:
                    edges[other].add(name)
            for other in info.before:
                if other in infos:
                    edges[name].add(other)
        cycle = _find_cycle(edges)
        if cycle:
            raise PluginError(
                "seasoning ordering cycle: " + " -> ".join(cycle)
                + "; fix the after/before declarations of these seasonings"
            )

    def seasoning(self, name: str) -> type[Seasoning]:
        """Return the seasoning class called `name`.

        Raises:
            UsageError: No such seasoning; the message lists the installed ones.
        """
        return _lookup(self.seasonings, name, "seasoning", "routetune seasonings")

    def backend(self, name: str) -> type[Backend]:
        """Return the backend class called `name`.

        Raises:
            UsageError: No such backend.
        """
        return _lookup(self.backends, name, "backend", "routetune seasonings")

    def strategy(self, name: str) -> type[Strategy]:
        """Return the search strategy class called `name`.

        Raises:
            UsageError: No such strategy.
        """
        return _lookup(self.strategies, name, "search strategy", "routetune seasonings")

    def metric(self, name: str) -> AnyMetric:
        """Return the accuracy metric called `name`.

        Raises:
            UsageError: No such metric.
        """
        return _lookup(self.metrics, name, "accuracy metric", "routetune seasonings")

    def executor(self, name: str) -> type[Executor]:
        """Return the executor class called `name`.

        Raises:
            UsageError: No such executor.
        """
        return _lookup(self.executors, name, "executor", "routetune seasonings")


def _lookup(table: dict[str, Entry[T]], name: str, kind: str, where: str) -> T:
    """The item called `name`; an unknown name gets the closest known one, or the list.

    Raises:
        UsageError: No such name.
    """
    if name not in table:
        close = difflib.get_close_matches(name, table, n=1)
        if close:
            raise UsageError(f"unknown {kind} '{name}'; did you mean '{close[0]}'? (all: "
                             f"`{where}`)")
        known = ", ".join(sorted(table)) or "none installed"
        raise UsageError(f"unknown {kind} '{name}'; known: {known} (see `{where}`)")
    return table[name].item


def _find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """Return one cycle of the directed graph `edges` as a list of names, or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []

