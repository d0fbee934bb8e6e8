"""The sampling panel: sampler groups and stage order (read from the engine's registry), presets, structured output, stop strings."""
