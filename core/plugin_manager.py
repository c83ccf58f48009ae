"""The plugin manager: hookspecs, entry-point loading, blocking and tracing."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pluggy
from pluggy import HookImpl

from routetune import hookspecs
from routetune.errors import PluginError, one_line
from routetune.registry import Registry

DISABLE_ENV = "ROUTETUNE_DISABLE_PLUGINS"
TRACE_ENV = "ROUTETUNE_TRACE_PLUGINS"


def get_plugin_manager(disabled: tuple[str, ...] = (),
                       extra: Mapping[str, object] | None = None) -> pluggy.PluginManager:
    """Build a fresh plugin manager with every ``routetune`` entry point loaded.

    Args:
        disabled: Entry-point names to block, in addition to the comma-separated names
            in the ``ROUTETUNE_DISABLE_PLUGINS`` environment variable.
        extra: Plugin modules by name, registered after the entry points as if they were
            installed (`routetune.testing.registry_with`); each replaces an installed
            plugin of the same name, or the same module installed under another name.

    With ``ROUTETUNE_TRACE_PLUGINS=1`` in the environment, every hook call is printed
    to stderr with the plugins that implement it, through pluggy's hook-call
    monitoring.

    Raises:
        PluginError: An entry point failed to import, or is not a valid plugin (a hook
            that does not exist, such as a misspelled one, or a hook with arguments its
            specification lacks); one line naming the plugin, its distribution, the
            cause and how to disable it.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    extra = dict(extra or {})
    env = [n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()]
    for name in (*disabled, *env):
        pm.set_blocked(name)
    points = importlib.metadata.entry_points(group=hookspecs.PROJECT)
    unknown = sorted(set(env) - {ep.name for ep in points})
    if unknown:
        print(f"routetune: warning: {DISABLE_ENV} names {', '.join(unknown)}, not an installed "
              f"plugin (installed: {', '.join(sorted({ep.name for ep in points}))})",
              file=sys.stderr)
    for ep in points:
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name) or ep.name in extra:
            continue  # an extra plugin of that name replaces the installed one
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "unknown distribution"
        try:
            plugin = ep.load()
        except Exception as e:
            raise PluginError(f"plugin '{ep.name}' ({dist}) failed to load: {e}; disable it "
                              f"with {DISABLE_ENV}={ep.name}") from e
        if any(plugin is other for other in extra.values()):
            continue  # the module under test, installed too: registered under its extra name
        _register(pm, plugin, ep.name, dist)
    for name, plugin in extra.items():
        _register(pm, plugin, name, "not installed")
    if os.environ.get(TRACE_ENV):
        pm.add_hookcall_monitoring(_trace, lambda outcome, name, impls, kwargs: None)
    return pm


def _register(pm: pluggy.PluginManager, plugin: object, name: str, dist: str) -> None:
    """Register one plugin and check its hooks against routetune's specifications.

    Raises:
        PluginError: A hook that does not exist (a misspelled one), or one with
            arguments its specification lacks; one line naming the plugin.
    """
    try:
        pm.register(plugin, name=name)
        pm.check_pending()  # each plugin on its own, so that a failure names it
    except pluggy.PluginValidationError as e:
        raise PluginError(f"plugin '{name}' ({dist}) is not a valid routetune plugin: "
                          f"{_unplugged(str(e))}; routetune's hooks: {', '.join(HOOKS)}; "
                          f"disable it with {DISABLE_ENV}={name}") from e


HOOKS = tuple(name for name in dir(hookspecs) if name.startswith("routetune_"))
"""The hook names plugins may implement (`routetune.hookspecs`)."""


def _unplugged(message: str) -> str:
    """The message of pluggy, one line, without the repr and file path of the module."""
    return one_line(message.split(" in plugin ", 1)[0].split("\nPlugin: ", 1)[0], 200)


def _trace(hook_name: str, impls: Sequence[HookImpl], kwargs: Mapping[str, Any]) -> None:
    """Print one hook call and its plugins (``ROUTETUNE_TRACE_PLUGINS``)."""
    plugins = ", ".join(impl.plugin_name for impl in impls) or "no plugin"
    print(f"routetune: hook {hook_name} -> {plugins}", file=sys.stderr)


def load_registry(disabled: tuple[str, ...] = (),
                  extra: Mapping[str, object] | None = None) -> Registry:
    """Load every installed plugin, and `extra`; the registry they filled.

    `extra` is as in `get_plugin_manager`.

    Raises:
        PluginError: A plugin failed to load or registered something invalid.
    """
    pm = get_plugin_manager(disabled, extra)
    dists = {
        ep.name: f"{ep.dist.name} {ep.dist.version}" if ep.dist else "?"
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT)
    }
    dists.update({name: "not installed" for name in extra or {}})
    return Registry.from_plugin_manager(pm, dists)
