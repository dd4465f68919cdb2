#!/bin/bash
python3 -c "print(len(open('/app/poem.txt').read().split()))" > /app/count.txt
