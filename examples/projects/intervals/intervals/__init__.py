"""Closed integer intervals: parsing range lists, merging, overlap and coverage."""
