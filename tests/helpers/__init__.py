"""Builders shared by the tests."""
