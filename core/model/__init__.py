"""The model: loading and sanitising it, its external data, and what every rewrite must keep."""
