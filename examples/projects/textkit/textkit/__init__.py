"""Small text utilities: slugs, word wrap, letter case and word counts."""
