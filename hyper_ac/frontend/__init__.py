"""Capture and serialise: FX joint graph -> the core's graph document."""
