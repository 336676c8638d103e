"""Context parallelism: load-balanced sequence chunks per CP rank, and Megatron's CP comm type."""
