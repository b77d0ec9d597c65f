"""Graph IR and passes (not built yet)."""
