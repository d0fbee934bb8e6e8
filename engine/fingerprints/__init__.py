"""What an answer's numbers depend on: the fingerprint value (record.py) and taking it from the
backend and the request (taking.py)."""
