"""Live environments that record agent episodes, beside the recorded-episode data flow (``awm``: Agent World Model)."""
