"""The torch backend: transformers models on CUDA or the CPU, with our KV cache, the lean decode step,
the compiled step, per-role matmul kernels and offload (engine/offload)."""
