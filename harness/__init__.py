"""Predict, launch, measure and explain vLLM serving limits."""

__version__ = "0.1.0"
