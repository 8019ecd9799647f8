"""The calculator held against real start-up logs from public GPUs (the field corpus)."""
