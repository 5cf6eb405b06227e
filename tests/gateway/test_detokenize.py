"""Incremental detokenisation and stop strings, on a byte-level fake tokenizer (one token
per UTF-8 byte: every multi-byte character spans several tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.gateway.detokenize import (
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    StopStringMatcher,
)

SPECIAL = 256  # an end token that decodes to nothing when special tokens are skipped


class ByteTokenizer:
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        data = bytes(t for t in token_ids if t != SPECIAL)
        text = data.decode("utf-8", errors="replace")
        if not skip_special_tokens and SPECIAL in token_ids:
            text += "<end>"
        return text


def byte_ids(text: str) -> list[int]:
    return list(text.encode())


def stream(text: str, chunk_sizes: Sequence[int] = (1,)) -> list[str]:
    """Deltas from feeding ``text``'s byte tokens in chunks of the given sizes (cycled)."""
    ids = byte_ids(text)
    detok = IncrementalDetokenizer(ByteTokenizer(), byte_ids("prompt: "))
    deltas, i, k = [], 0, 0
    while i < len(ids):
        n = chunk_sizes[k % len(chunk_sizes)]
        deltas.append(detok.push(ids[i : i + n]))
        i, k = i + n, k + 1
    deltas.append(detok.flush())
    return deltas


def test_multibyte_characters_are_held_until_complete() -> None:
    deltas = stream("a😀é")
    # "😀" is 4 byte tokens: nothing for the first three, the whole emoji on the fourth.
    assert deltas[:6] == ["a", "", "", "", "😀", ""]
    assert deltas[6] == "é"
    assert "".join(deltas) == "a😀é"


@given(st.text(), st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_deltas_join_to_the_text_and_never_split_a_character(text: str, chunks: list[int]) -> None:
    deltas = stream(text, chunks)
    assert "".join(deltas) == text
    if REPLACEMENT_CHAR not in text:
        assert all(REPLACEMENT_CHAR not in d for d in deltas)


def test_flush_releases_an_incomplete_character_as_replacement() -> None:
    detok = IncrementalDetokenizer(ByteTokenizer(), [])
    assert detok.push([0xF0, 0x9F]) == ""  # first half of an emoji
    assert detok.flush() == REPLACEMENT_CHAR


def test_special_tokens_are_skipped() -> None:
    detok = IncrementalDetokenizer(ByteTokenizer(), [])
    assert detok.push(byte_ids("ok")) == "ok"
    assert detok.push([SPECIAL]) == ""
    assert detok.flush() == ""


def run_stop(pieces: Sequence[str], stop: Sequence[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stop)
    out = []
    for piece in pieces:
        safe, stopped = matcher.push(piece)
        out.append(safe)
        if stopped:
            return "".join(out), True
    out.append(matcher.flush())
    return "".join(out), False


def test_stop_string_split_across_pieces_is_found_and_not_returned() -> None:
    assert run_stop(["Hello ", "wor", "ld", "!"], ["world"]) == ("Hello ", True)


def test_text_that_might_start_a_stop_string_is_withheld() -> None:
    matcher = StopStringMatcher(["</end>"])
    assert matcher.push("abc</e") == ("abc", False)
    # The held "</e" turns out not to be the stop string: released with what follows.
    assert matcher.push("x") == ("</ex", False)
    assert matcher.flush() == ""


def test_earliest_of_several_stop_strings_wins() -> None:
    assert run_stop(["one two three"], ["three", "two"]) == ("one ", True)


def test_no_match_returns_everything() -> None:
    assert run_stop(["ab", "c"], ["abd"]) == ("abc", False)


def test_nothing_is_returned_after_a_stop() -> None:
    matcher = StopStringMatcher(["x"])
    assert matcher.push("axb") == ("a", True)
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


@given(
    st.text(alphabet="abc", max_size=30),
    st.text(alphabet="abc", min_size=1, max_size=4),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
)
def test_stop_matching_equals_cutting_the_whole_text(text: str, stop: str, cuts: list[int]) -> None:
    pieces, i, k = [], 0, 0
    while i < len(text):
        n = cuts[k % len(cuts)]
        pieces.append(text[i : i + n])
        i, k = i + n, k + 1
    found = text.find(stop)
    expected = (text[:found], True) if found >= 0 else (text, False)
    assert run_stop(pieces, [stop]) == expected


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher([""])
