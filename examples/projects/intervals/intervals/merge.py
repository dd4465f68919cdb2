"""Merging, overlap and coverage of closed intervals given as (start, end) pairs."""

Interval = tuple[int, int]


def merge(intervals: list[Interval]) -> list[Interval]:
    """Merges overlapping or adjacent intervals ((1, 2) and (3, 4) become (1, 4)), sorted by start."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlaps(a: Interval, b: Interval) -> bool:
    """True when the two closed intervals share at least one point."""
    return a[0] <= b[1] and b[0] <= a[1]


def covered(intervals: list[Interval]) -> int:
    """How many integers lie in at least one interval."""
    return sum(end - start + 1 for start, end in merge(intervals))
