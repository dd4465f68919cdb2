"""Bearer-token auth for the test registry, as Docker Hub and most registries do it: the registry sends clients to a
token server, which checks their basic credentials and hands out a signed JWT naming what they may pull.

The token server is a few lines of http.server on loopback; the JWT is signed (RS256) with a key whose self-signed
certificate the registry trusts (`rootcertbundle`), and carries that certificate in its `x5c` header.
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

SERVICE = "rollbox-tests"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """Issues pull and push tokens to `users` (name -> password); anyone else gets a token that allows nothing."""

    def __init__(self, root: Path, users: Mapping[str, str]) -> None:
        self.users = dict(users)
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVICE)])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                            .not_valid_before(now - datetime.timedelta(days=1))
                            .not_valid_after(now + datetime.timedelta(days=1))
                            .sign(self.key, hashes.SHA256()))
        self.bundle = root / "token-cert.pem"
        self.bundle.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))
        self.issued: list[str] = []
        """Who each token went to ("" for anonymous)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def registry_config(self) -> list[str]:
        """The `auth:` section of the registry's config.yml."""
        return ["auth:", "  token:", f"    realm: {self.realm}", f"    service: {SERVICE}", f"    issuer: {SERVICE}",
                f"    rootcertbundle: {self.bundle}"]

    def stop(self) -> None:
        self._server.shutdown()

    def token(self, user: str, scope: str) -> str:
        access = []
        if user and scope.startswith("repository:"):
            _, name, _actions = scope.split(":")
            access.append({"type": "repository", "name": name, "actions": ["pull", "push"]})
        der = self.certificate.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {"iss": SERVICE, "sub": user, "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": secrets.token_hex(8), "access": access}
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64(signature)}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                user = ""
                given = self.headers.get("Authorization", "")
                if given.startswith("Basic "):
                    name, _, password = base64.b64decode(given[6:]).decode().partition(":")
                    if server.users.get(name) != password:
                        self.send_response(401)
                        self.end_headers()
                        return
                    user = name
                scope = parse_qs(urlparse(self.path).query).get("scope", [""])[0]
                server.issued.append(user)
                token = server.token(user, scope)
                body = json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        return Handler
