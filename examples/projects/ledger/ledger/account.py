"""Accounts whose balance never goes below zero."""


class InsufficientFunds(Exception):
    """A withdrawal or transfer asked for more than the balance."""


class Account:
    def __init__(self, owner: str, balance: int = 0) -> None:
        self.owner = owner
        self.balance = balance

    def deposit(self, cents: int) -> None:
        if cents <= 0:
            raise ValueError("deposit a positive amount")
        self.balance += cents

    def withdraw(self, cents: int) -> None:
        if cents <= 0:
            raise ValueError("withdraw a positive amount")
        if cents > self.balance:
            raise InsufficientFunds(f"{self.owner} has {self.balance}, not {cents}")
        self.balance -= cents

    def transfer(self, other: "Account", cents: int) -> None:
        """Moves money to `other`; if the withdrawal fails, neither balance changes."""
        self.withdraw(cents)
        other.deposit(cents)
