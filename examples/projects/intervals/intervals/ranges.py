"""Range lists such as '1-3,7,10-11'."""


def parse_ranges(text: str) -> list[int]:
    """'1-3,7,10-11' -> [1, 2, 3, 7, 10, 11]; both ends of a range are included, spaces ignored."""
    numbers: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        start, dash, end = part.partition("-")
        if dash:
            numbers.extend(range(int(start), int(end) + 1))
        else:
            numbers.append(int(start))
    return numbers


def format_ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3,7': the inverse of `parse_ranges` for sorted, distinct numbers."""
    parts: list[str] = []
    index = 0
    while index < len(numbers):
        end = index
        while end + 1 < len(numbers) and numbers[end + 1] == numbers[end] + 1:
            end += 1
        parts.append(str(numbers[index]) if end == index else f"{numbers[index]}-{numbers[end]}")
        index = end + 1
    return ",".join(parts)
