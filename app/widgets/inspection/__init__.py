"""The inspector: one token's alternatives, stages and chart; the layer view, attention and the attached passages; step mode's panel."""
