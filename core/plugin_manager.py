"""The plugin manager: hookspecs, entry-point loading, blocking and tracing."""

from __future__ import annotations

import importlib.metadata
import logging
import os

import pluggy

from routetune import hookspecs
from routetune.errors import PluginError
from routetune.registry import Registry

logger = logging.getLogger(__name__)

DISABLE_ENV = "ROUTETUNE_DISABLE_PLUGINS"
TRACE_ENV = "ROUTETUNE_TRACE_PLUGINS"


def get_plugin_manager(disabled: tuple[str, ...] = ()) -> pluggy.PluginManager:
    """Build a fresh plugin manager with every ``routetune`` entry point loaded.

    Args:
        disabled: Entry-point names to block, in addition to the comma-separated names
            in the ``ROUTETUNE_DISABLE_PLUGINS`` environment variable.

    Raises:
        PluginError: An entry point failed to import; one line naming the plugin, its
            distribution, the cause and how to disable it.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    env = [n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()]
    for name in (*disabled, *env):
        pm.set_blocked(name)
    for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as e:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "unknown distribution"
            raise PluginError(
                f"plugin '{ep.name}' ({dist}) failed to load: {e}; "
                f"disable it with {DISABLE_ENV}={ep.name}"
            ) from e
        pm.register(plugin, name=ep.name)
    pm.check_pending()
    if os.environ.get(TRACE_ENV):
        pm.add_hookcall_monitoring(
            lambda name, impls, kw: logger.info("hook %s -> %d impls", name, len(impls)),
            lambda outcome, name, impls, kw: None,
        )
    return pm


def load_registry(disabled: tuple[str, ...] = ()) -> Registry:
    """Load every installed plugin and return the registry they filled.

    Raises:
        PluginError: A plugin failed to load or registered something invalid.
    """
    pm = get_plugin_manager(disabled)
    dists = {
        ep.name: f"{ep.dist.name} {ep.dist.version}" if ep.dist else "?"
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT)
    }
    return Registry.from_plugin_manager(pm, dists)
