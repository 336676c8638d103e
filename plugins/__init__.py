"""Mechanisms that attach features to the trainer at a closed set of named points."""
