#!/bin/bash
# Harbor copies tests/ to /tests and reads the reward from /logs/verifier/reward.txt.
if python3 /tests/test_outputs.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
