"""The model gateway: an OpenAI-compatible address inside each sandbox that asks for one, forwarding to the
trainer's inference server, recording every call and holding the episode to its budgets (docs/gateway.md)."""

from rollbox.node.gateway.gateway import BASE_URL, PORT, Gateway

__all__ = ["BASE_URL", "PORT", "Gateway"]
