"""The loop that turns a `RunConfig` into a Megatron Core run."""
