import pytest
from ledger.money import format_amount, parse_amount, split


def test_parse_plain():
    assert parse_amount("12.34") == 1234


def test_parse_dollars_and_commas():
    assert parse_amount("$1,234.50") == 123450


def test_parse_one_decimal():
    assert parse_amount("1.5") == 150


def test_parse_negative_forms():
    assert parse_amount("-3") == -300
    assert parse_amount("(2.25)") == -225


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_amount("12.345")


def test_format_plain():
    assert format_amount(123450) == "$1,234.50"


def test_format_small_cents():
    assert format_amount(105) == "$1.05"


def test_format_negative():
    assert format_amount(-250) == "($2.50)"


def test_split_even():
    assert split(900, 3) == [300, 300, 300]


def test_split_sum_exact():
    shares = split(1000, 3)
    assert sum(shares) == 1000
    assert shares == [334, 333, 333]


def test_split_rejects_zero_parts():
    with pytest.raises(ValueError):
        split(100, 0)
