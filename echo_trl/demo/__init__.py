"""The CPU demo of ``echo-trl train`` (no arguments): not part of the library core.

* :mod:`echo_trl.demo.run`: the ECHO vs lambda = 0 comparison and its command line;
* :mod:`echo_trl.demo.tiny`: tiny local tokenizers and models (also the no-download default of the tests
  and benchmarks) and the one corpus builder they are trained on;
* :mod:`echo_trl.demo.warmup`: the env-blind warm-up that stands in for pretraining;
* :mod:`echo_trl.demo.episodes`: synthetic AWM-style episodes, the fallback without bundled data.
"""
