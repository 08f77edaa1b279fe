"""Kernels for the GPU path, each paired with its plain-torch reference (the CPU path)."""
