"""Compiled-model runtime (not built yet)."""
