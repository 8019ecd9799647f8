"""A run record as a Polyaxon run: inputs, live series, outputs and artifacts."""
