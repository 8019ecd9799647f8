"""Polyaxon specs, the engine process, local execution, one experiment and a sweep of them."""
