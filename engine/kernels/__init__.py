"""Kernels for packed GGUF weights. `reference` is the portable torch implementation
of the kernel interface (dequantize, get_rows, mul_mat_vec) that every device can
run and every fast kernel is tested against."""
