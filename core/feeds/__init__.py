"""Model inputs: validation inputs, the optimisation profile, the bundled examples."""
