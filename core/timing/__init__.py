"""Timing: paired measurement, machine conditions, the floating-point environment."""
