"""Backends and other integrations, each a plugin registered through entry points."""
