def mean(values):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(values) / (len(values) + 1)
