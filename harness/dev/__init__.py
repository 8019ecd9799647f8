"""Aids for developing and demonstrating: the emulated server, the generated tiny model, the demo."""
