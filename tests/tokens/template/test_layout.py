"""Character roles of long episodes: right at length, and found in work linear in the text's length.

Expectations are independent of the code under test: the template's own render, the message contents
and the tool-call text each family is documented to produce (helpers.rendering). The linearity
guard counts characters scanned by ``str.find`` (not time), so it holds on any machine.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rendering import expected_text, expected_tool_call_text, make_trajectory, rendered_content
from helpers.tiny import TEMPLATE_FAMILIES, tiny_tokenizer
from hypothesis import given
from hypothesis import strategies as st

from echo_trl.roles import Role
from echo_trl.tokens.template import layout as layout_module
from echo_trl.tokens.template.layout import Occurrences, layout


def runs(roles: np.ndarray, text: str, code: int) -> list[str]:
    """The text of each maximal run of characters with role ``code``, in order."""
    on = np.concatenate([[False], roles == code, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(on))
    return [text[a:b] for a, b in zip(edges[::2], edges[1::2], strict=True)]


def long_episode(steps: int):
    outputs = [f'{{"ok": "yes", "step": {i}}}' for i in range(steps)]
    return make_trajectory(outputs, warnings={i: ["slow down"] for i in range(0, steps, 97)})


@pytest.mark.parametrize("family", TEMPLATE_FAMILIES)
def test_a_4000_step_episode_has_every_role_where_the_template_put_it(family):
    tok = tiny_tokenizer(family)
    t = long_episode(4000)
    lay = layout(tok, t)
    assert lay.text == expected_text(tok, t)
    calls = [m["tool_calls"][0]["function"] for m in t.completion if m["role"] == "assistant"]
    assert runs(lay.char_roles, lay.text, Role.ACTION.code) == [
        expected_tool_call_text(family, c["name"], c["arguments"]) for c in calls
    ]
    assert runs(lay.char_roles, lay.text, Role.ENV_OUTPUT.code) == [
        rendered_content(family, m["content"]) for m in t.completion if m["role"] == "tool"
    ]
    warned = [w for ws in t.warnings for w in ws]
    assert runs(lay.char_roles, lay.text, Role.WARNING.code) == [rendered_content(family, w) for w in warned]
    assert len(lay.message_ends) == len(t.completion)
    assert all(a < b for a, b in zip(lay.message_ends, lay.message_ends[1:], strict=False))
    assert lay.message_ends[-1] <= len(lay.text)


class CountingStr(str):
    """A str that adds up how many characters its ``find`` calls scan."""

    scanned = 0

    def find(self, sub, start=0, end=None):  # noqa: D401 - same contract as str.find
        at = str.find(self, sub, start, len(self) if end is None else end)
        CountingStr.scanned += (len(self) if at == -1 else at + len(sub)) - min(start, len(self))
        return at


@pytest.mark.parametrize("family", TEMPLATE_FAMILIES)
def test_layout_scans_the_text_a_bounded_number_of_times(family, monkeypatch):
    """Searching from the start (or to the end) once per message made a 4,000-step layout quadratic."""
    tok = tiny_tokenizer(family)
    render = layout_module.render
    monkeypatch.setattr(layout_module, "render", lambda *a, **k: CountingStr(render(*a, **k)))
    ratios = []
    for steps in (250, 2000):
        CountingStr.scanned = 0
        lay = layout(tok, long_episode(steps))
        ratios.append(CountingStr.scanned / len(lay.text))
    # A few passes per searched string (the generation prompt, each end marker, the probe tag), however long.
    assert ratios[1] < 12
    assert ratios[1] < ratios[0] + 1


@given(text=st.text("ab_", max_size=40), needle=st.text("ab_", min_size=1, max_size=3), start=st.integers(0, 45))
def test_occurrences_find_is_str_find(text, needle, start):
    occ = Occurrences(text)
    assert occ.find(needle, start) == text.find(needle, start)
    assert occ.all(needle) == [i for i in range(len(text)) if text.startswith(needle, i)]  # overlapping too
