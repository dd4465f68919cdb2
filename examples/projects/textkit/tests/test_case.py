from textkit.case import camel_to_snake, title_case


def test_camel_simple():
    assert camel_to_snake("parseResponse") == "parse_response"


def test_camel_acronym():
    assert camel_to_snake("parseHTTPResponse") == "parse_http_response"


def test_camel_already_snake():
    assert camel_to_snake("already_snake") == "already_snake"


def test_title_case_minor_words():
    assert title_case("war and peace") == "War and Peace"


def test_title_case_first_word():
    assert title_case("the lord of the rings") == "The Lord of the Rings"


def test_title_case_normalises_case():
    assert title_case("hELLO wORLD") == "Hello World"
