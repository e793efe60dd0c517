"""The bottom layer: onnxruntime sessions and onnx tensor facts every other layer may use."""
