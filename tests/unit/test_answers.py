"""Who holds a sandbox a claim made (node/answers.py): each answer carrying it counts once settled as taken, and a
sandbox none of them reached ends. tests/server/test_claim_faults.py runs the same through a real server."""

from __future__ import annotations

from rollbox.node.answers import Answers
from rollbox.node.keys import KEY_WINDOW


def test_a_claim_without_a_key_ends_when_its_one_answer_finds_nobody() -> None:
    answers = Answers(KEY_WINDOW)
    assert answers.answered("t", "s1", taken=False) is True
    assert answers.answered("t", "s2", taken=True) is False


def test_a_sandbox_handed_to_two_callers_that_both_left_ends() -> None:
    """A frozen node thaws with nginx's warm claim and the router's claim of the same key queued, both given up
    on: the second waits for the first and is handed the same sandbox. Neither caller is there."""
    answers = Answers(KEY_WINDOW)
    answers.made("s1", 2)
    assert answers.answered("t", "s1", taken=False) is False  # the other answer is still on its way
    assert answers.answered("t", "s1", taken=False) is True


def test_a_sandbox_one_caller_took_stays_until_that_answer_is_withdrawn() -> None:
    answers = Answers(KEY_WINDOW)
    answers.made("s1", 1)
    answers.sent("s1")  # a lookup of its key
    assert answers.answered("t", "s1", taken=True, attempt="nginx") is False
    assert answers.answered("t", "s1", taken=False, attempt="router") is False
    assert answers.withdraw(["router"]) == []  # never counted as taken
    assert answers.withdraw(["nginx"]) == [("t", "s1")]  # nginx stopped waiting after all: nobody holds it
    assert answers.withdraw(["nginx"]) == []  # once is enough


def test_an_attempt_withdrawn_before_it_was_answered_is_not_taken() -> None:
    """The withdrawal and the claim were queued on a frozen node; it took the withdrawal first."""
    answers = Answers(KEY_WINDOW)
    assert answers.withdraw(["late"]) == []
    assert answers.answered("t", "s1", taken=True, attempt="late") is True


def test_a_lookup_of_a_sandbox_made_before_counting_began_leaves_it_held() -> None:
    """Made before the node restarted (or longer ago than its key counts): whoever its first answer reached may hold
    it, so a lookup whose caller left ends nothing."""
    answers = Answers(KEY_WINDOW)
    answers.sent("old")
    assert answers.answered("t", "old", taken=False) is False
