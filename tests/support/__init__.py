"""Test helpers (not product code): real-shaped images, a registry client, a token issuer, the
test services' settings and the docker CLI. See tests/conftest.py for the fixtures."""
