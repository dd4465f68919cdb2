import pytest
from textkit.wrap import wrap


def test_wrap_short_text_fits():
    assert wrap("hello world", 20) == ["hello world"]


def test_wrap_breaks_lines():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_width():
    assert wrap("abc def ghi", 7) == ["abc def", "ghi"]


def test_wrap_long_word_alone():
    assert wrap("a incomprehensibilities b", 5) == ["a", "incomprehensibilities", "b"]


def test_wrap_empty():
    assert wrap("   ", 5) == []


def test_wrap_rejects_zero_width():
    with pytest.raises(ValueError):
        wrap("x", 0)


def test_wrap_one_over_width():
    assert wrap("aaaa bbbb", 8) == ["aaaa", "bbbb"]
