"""Word frequencies."""

import re


def word_counts(text: str) -> dict[str, int]:
    """How often each lowercase word occurs; apostrophes stay inside words."""
    counts: dict[str, int] = {}
    for word in re.findall(r"[\w']+", text.lower()):
        counts[word] = counts.get(word, 0) + 1
    return counts


def top_words(text: str, n: int) -> list[tuple[str, int]]:
    """The `n` most frequent words, most frequent first, ties in alphabetical order."""
    counts = word_counts(text)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]
