from tessel.kernels.attention.metadata import AttentionMetadata

__all__ = ["AttentionMetadata"]
