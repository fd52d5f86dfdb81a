"""Recorded episodes -> ``Trajectory`` -> typed dataset rows: record formats, build / load / save, dataset card."""
