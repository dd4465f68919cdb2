from textkit.count import top_words, word_counts


def test_word_counts_ignores_case():
    assert word_counts("Cat cat CAT dog") == {"cat": 3, "dog": 1}


def test_word_counts_keeps_apostrophes():
    assert word_counts("don't stop") == {"don't": 1, "stop": 1}


def test_top_words_most_frequent_first():
    assert top_words("b a b c b a", 2) == [("b", 3), ("a", 2)]


def test_top_words_ties_alphabetical():
    assert top_words("pear apple fig", 3) == [("apple", 1), ("fig", 1), ("pear", 1)]
