"""User tools built on the trainer: the dry run, the benchmarks, the resume check, the scaling
harness and the GPU checks (with the edits their offline wheel build makes, `gpu_wheels`). The
training loop itself never imports them."""
