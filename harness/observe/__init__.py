"""What the engine says about itself: its start-up log, /metrics, the capacity it logged, the device."""
