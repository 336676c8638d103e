"""How a script becomes a run: the one entry contract every script goes through, the command
objects of all scripts, and the training pipeline's two paths (the launching process, a rank)."""
