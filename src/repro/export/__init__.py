"""`python -m repro.export`: a checkpoint's model as one file a consumer runs without this
repository (ONNX, TorchScript) or loads into its architecture (safetensors), checked against
PyTorch on real images (`command`: the entry point; `formats`: one writer per format)."""
