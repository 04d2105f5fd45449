"""Helpers the test folders share (servers on loopback ports, the admin test data); fixtures stay in conftest.py."""
