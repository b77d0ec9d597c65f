"""A compiled model against its peers (ONNX Runtime, PyTorch): `tuner bench`."""
