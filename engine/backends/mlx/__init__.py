"""The MLX backend: mlx-lm models on Apple Silicon, or on a Linux CPU through `mlx[cpu]`."""
