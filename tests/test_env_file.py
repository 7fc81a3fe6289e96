"""Env vars imported from a file (SPEC §3): the parser alone, without a database. Through the
wizard's form (the 100-variable limit with what the form already has): tests/test_spec_limits.py."""

from __future__ import annotations

import pytest

from jobs import validators as v


def test_parse_env_file_reads_key_value_lines():
    text = "# comment\nexport A=1\nB = two words\n\nC='quoted'\nD=\"x=y\"\n"
    assert v.parse_env_file(text) == [
        {"name": "A", "value": "1", "sensitive": False},
        {"name": "B", "value": "two words", "sensitive": False},
        {"name": "C", "value": "quoted", "sensitive": False},
        {"name": "D", "value": "x=y", "sensitive": False},
    ]


@pytest.mark.parametrize(
    "text, existing, needle",
    [
        pytest.param("".join(f"V{i}=x\n" for i in range(101)), 0, "at most 100", id="101-lines"),
        pytest.param("".join(f"V{i}=x\n" for i in range(51)), 50, "already has 50", id="50-plus-51"),
        pytest.param("A=1\nnot a line\n", 0, "line 2", id="bad-line"),
        pytest.param("A=1\nA=2\n", 0, "repeated", id="repeated"),
        pytest.param("1A=1\n", 0, "not a valid name", id="bad-name"),
    ],
)
def test_parse_env_file_refuses_the_whole_file(text, existing, needle):
    with pytest.raises(Exception) as info:
        v.parse_env_file(text, existing=existing)
    assert needle in " ".join(info.value.messages)
    assert "Nothing was imported" in " ".join(info.value.messages) or "nothing was imported" in " ".join(
        info.value.messages
    )
