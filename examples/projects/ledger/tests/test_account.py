import pytest
from ledger.account import Account, InsufficientFunds


def test_deposit_and_withdraw():
    account = Account("ann")
    account.deposit(500)
    account.withdraw(200)
    assert account.balance == 300


def test_withdraw_entire_balance():
    account = Account("ann", 500)
    account.withdraw(500)
    assert account.balance == 0


def test_overdraft_refused():
    account = Account("ann", 100)
    with pytest.raises(InsufficientFunds):
        account.withdraw(101)
    assert account.balance == 100


def test_transfer_moves_money():
    ann, bob = Account("ann", 500), Account("bob")
    ann.transfer(bob, 200)
    assert (ann.balance, bob.balance) == (300, 200)


def test_failed_transfer_changes_nothing():
    ann, bob = Account("ann", 100), Account("bob")
    with pytest.raises(InsufficientFunds):
        ann.transfer(bob, 200)
    assert (ann.balance, bob.balance) == (100, 0)
