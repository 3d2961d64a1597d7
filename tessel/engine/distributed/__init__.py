"""Tensor parallelism on torch.distributed: the process groups, rank 0's broadcast of each step,
the worker processes that follow it, and how a failed group is noticed and shut down."""
