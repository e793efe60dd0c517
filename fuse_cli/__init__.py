"""fuse: an ONNX operator-fusion optimizer with an activation-memory audit."""

__version__ = "0.1.0"
