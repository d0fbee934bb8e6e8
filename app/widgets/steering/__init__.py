"""The steering panel, its strength knob and what steering did to each token."""
