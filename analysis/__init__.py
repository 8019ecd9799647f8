"""Joins, comparisons, diagnosis and reports over harness run records; never talks to vLLM."""
