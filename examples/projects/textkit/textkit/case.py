"""Letter case conversions."""

import re

MINOR_WORDS = frozenset({"a", "an", "and", "in", "of", "on", "or", "the", "to"})


def camel_to_snake(name: str) -> str:
    """'parseHTTPResponse' -> 'parse_http_response'."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", spaced)
    return spaced.lower()


def title_case(text: str) -> str:
    """Capitalises every word except minor words, which stay lowercase unless they come first."""
    words = []
    for index, word in enumerate(text.split()):
        if index > 0 and word.lower() in MINOR_WORDS:
            words.append(word.lower())
        else:
            words.append(word[:1].upper() + word[1:].lower())
    return " ".join(words)
