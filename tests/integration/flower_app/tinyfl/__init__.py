"""fl-dispatcher's test Flower App."""
