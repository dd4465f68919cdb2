"""The live dashboard `rollbox serve` shows at /dashboard: nodes, warm pools, sandboxes, latency, command logs.

A static page (HTML, CSS and JavaScript in `static/`, no build step) that reads the routes below with the
token the user typed into it, or with none when the server says it needs none (an open server). They see
what the API lets the token see: a tenant its own sandboxes, an admin every tenant's and each sandbox's last
commands. The trajectory viewer is part of the page and reads a file the user opens in the browser: the
server reads no file for it.
"""
