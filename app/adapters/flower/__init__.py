"""The Flower backend: a net whose server is a Flower SuperLink (see client.py)."""
