"""Typed configuration, recipe functions and the recipe registry (no torch imports here)."""
