"""Test support: random checkpoints in the published layout (not imported by the runtime)."""
