"""fl-dispatcher's tiny Flower App (the demo's and the tests')."""
