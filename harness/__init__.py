"""Predict, launch, measure and analyse vLLM serving limits."""

__version__ = "0.1.0"
