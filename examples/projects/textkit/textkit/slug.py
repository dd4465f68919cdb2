"""URL slugs."""

import re
import unicodedata


def slugify(text: str, separator: str = "-") -> str:
    """Lowercase ASCII words of `text` joined by `separator`: 'Héllo, World!' -> 'hello-world'."""
    normalized = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    words = re.findall(r"[a-z0-9]+", normalized.lower())
    return separator.join(words)
