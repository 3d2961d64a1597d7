"""Triton kernels, their plain-PyTorch references, and the dispatch point the engine calls."""
