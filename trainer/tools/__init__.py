"""User tools built on the trainer: the dry run, the benchmarks, the resume check and the scaling
harness. The training loop itself never imports them."""
