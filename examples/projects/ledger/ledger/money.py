"""Parsing, formatting and splitting amounts held as integer cents."""


def parse_amount(text: str) -> int:
    """'$1,234.5' -> 123450; a leading '-' or surrounding parentheses make it negative."""
    raw = text.strip()
    negative = raw.startswith("-") or (raw.startswith("(") and raw.endswith(")"))
    digits = raw.strip("()-").lstrip("$").replace(",", "")
    whole, _, fraction = digits.partition(".")
    if not (whole or fraction) or not (whole or "0").isdigit() or not (fraction or "0").isdigit() or len(fraction) > 2:
        raise ValueError(f"not an amount: {text!r}")
    cents = int(whole or "0") * 100 + int(fraction.ljust(2, "0") or "0")
    return -cents if negative else cents


def format_amount(cents: int) -> str:
    """123450 -> '$1,234.50'; negative amounts in parentheses."""
    whole, fraction = divmod(abs(cents), 100)
    text = f"${whole:,}.{fraction:02d}"
    return f"({text})" if cents < 0 else text


def split(cents: int, parts: int) -> list[int]:
    """Splits an amount into `parts` shares that differ by at most one cent and add up exactly."""
    if parts <= 0:
        raise ValueError("parts must be positive")
    base, remainder = divmod(cents, parts)
    return [base + 1 if index < remainder else base for index in range(parts)]
