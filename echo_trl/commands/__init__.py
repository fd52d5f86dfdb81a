"""The ``echo-trl`` command line: ``cli`` dispatches to one module per sub-command."""
