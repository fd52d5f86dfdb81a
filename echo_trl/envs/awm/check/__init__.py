"""Is an AWM scenario fit to collect from and train on? A health check over any AWM-1K directory.

AWM-1K is LLM-generated: some databases do not build, some servers do not start, some verifiers do not compile
or raise, and some tasks' untouched initial databases already pass their verifier (an agent that does nothing
scores "complete", which GRPO rewards as the shortest rollout). ``scenario_check`` checks one scenario (its
database, server, tools, verifier code, and each task's verifier run against the untouched database), ``run``
checks many at once into a resumable output, ``report`` assembles and prints the report, and ``usable`` reads a
report back and says which scenarios and tasks capture and online training skip.
"""
