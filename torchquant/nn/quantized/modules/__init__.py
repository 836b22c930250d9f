"""Static quantized module implementations, one concept per file."""
