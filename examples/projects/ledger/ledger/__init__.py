"""Money amounts in integer cents, and accounts that never go negative."""
