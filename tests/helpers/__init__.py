"""Shared test helpers: tiny tokenizers of real model families."""
