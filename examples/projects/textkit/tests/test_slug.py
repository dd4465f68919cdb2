from textkit.slug import slugify


def test_slugify_basic():
    assert slugify("hello world") == "hello-world"


def test_slugify_lowercases():
    assert slugify("Hello World") == "hello-world"


def test_slugify_strips_accents_and_punctuation():
    assert slugify("Héllo, wörld!") == "hello-world"


def test_slugify_separator():
    assert slugify("a b c", separator="_") == "a_b_c"


def test_slugify_empty():
    assert slugify("  !! ") == ""
