"""Episodes collected at scale: jobs in flight over one server pool (``jobs``), the resumable output
(``store``), its summary (``summary``), the collection run itself (``run``) and capture from an upstream
OpenEnv server (``openenv``)."""
