"""Tessel: an OpenAI-compatible LLM inference server.

The layers, each importing only those left of it: config -> kernels -> engine -> server.
They live under one package so that their generic names (transformers depends on a
distribution whose import name is `kernels`) cannot collide with anything installed beside us.
"""
