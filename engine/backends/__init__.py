"""Model runtimes behind one small protocol (`base.Backend`)."""
