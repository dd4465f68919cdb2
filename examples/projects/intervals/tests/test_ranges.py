from intervals.ranges import format_ranges, parse_ranges


def test_parse_single_numbers():
    assert parse_ranges("4,2") == [4, 2]


def test_parse_inclusive_range():
    assert parse_ranges("1-3,7,10-11") == [1, 2, 3, 7, 10, 11]


def test_parse_ignores_spaces_and_empty_parts():
    assert parse_ranges(" 5 - 6 ,, 8") == [5, 6, 8]


def test_format_runs():
    assert format_ranges([1, 2, 3, 7, 10, 11]) == "1-3,7,10-11"


def test_format_round_trip():
    assert parse_ranges(format_ranges([0, 1, 5, 6, 7, 9])) == [0, 1, 5, 6, 7, 9]
