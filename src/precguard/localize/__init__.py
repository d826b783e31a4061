"""Localize an error: replay one module on the device under test with golden inputs."""
