from intervals.merge import covered, merge, overlaps


def test_merge_overlapping():
    assert merge([(1, 3), (2, 5)]) == [(1, 5)]


def test_merge_adjacent():
    assert merge([(1, 2), (3, 4)]) == [(1, 4)]


def test_merge_contained():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]


def test_merge_unsorted_input():
    assert merge([(8, 9), (1, 2), (4, 5)]) == [(1, 2), (4, 5), (8, 9)]


def test_overlaps_shared_endpoint():
    assert overlaps((1, 3), (3, 5))


def test_overlaps_disjoint():
    assert not overlaps((1, 2), (4, 5))


def test_covered_counts_each_integer_once():
    assert covered([(1, 3), (2, 4), (10, 10)]) == 5


def test_overlaps_contained():
    assert overlaps((1, 10), (4, 5))
    assert overlaps((4, 5), (1, 10))
