"""A small but real OpenID Connect provider for the tests, run as its own process on 127.0.0.1.

It imports nothing of this project (the standard library, `cryptography` and PyJWT) so that the relying
party (`access.oidc`) is tested against a second implementation over HTTP, as it meets a real IdP:

* `GET /.well-known/openid-configuration` — the discovery document (issuer = the server's own URL);
* `GET /jwks` — its RSA public key (RS256, a `kid`);
* `GET /authorize` — the authorization code flow: checks `response_type=code`, the client and its
  registered `redirect_uri`, the `openid` scope, and takes `state`, `nonce` and a PKCE S256
  `code_challenge`; it "approves" at once as the configured test user and redirects back with a
  single-use code (an unknown client or redirect URI is answered 400, never redirected);
* `POST /token` — redeems the code once (client secret by `client_secret_post` or basic auth, the same
  `redirect_uri`, the PKCE verifier) and answers an access token and an RS256-signed ID token with
  `iss`, `sub`, `aud`, `exp`, `iat`, `auth_time`, `nonce` and the user's claims (`groups`, `amr`,
  `acr`, `preferred_username`, `email`, ...);
* `GET /userinfo` — the user's claims for a bearer access token it issued;
* `POST /control` — the test's switchboard (JSON): `client` (id, secret, redirect URIs), `user` (the
  claims of the next logins), and what the next ID tokens get wrong on purpose: `issuer` (another
  `iss`), `expires_in` (negative: already expired), `audience`, `nonce`; `GET /control` returns the
  configuration and the token requests seen (`tokenRequests`: grant, whether a PKCE verifier came).

The claims of a code are those configured when the code was issued.

Run: `python tests/oidc_server.py PORT`; it prints `ready` when it listens.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Provider:
    """The provider's state: one signing key, the registered client, the test user, codes and tokens."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)
        self.lock = threading.Lock()
        self.config: dict = {
            "client": {"id": "", "secret": "", "redirect_uris": []},
            "user": {"sub": "user-1", "preferred_username": "alice"},
            "issuer": None,
            "expires_in": 300,
            "audience": None,
            "nonce": None,
        }
        self.codes: dict[str, dict] = {}
        self.access_tokens: dict[str, dict] = {}
        self.token_requests: list[dict] = []

    # ----------------------------------------------------------------------------------------------
    def discovery(self) -> dict:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "client_secret_basic"],
            "code_challenge_methods_supported": ["S256"],
            "scopes_supported": ["openid", "email", "profile"],
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "nonce", "amr", "acr", "groups"],
        }

    def jwks(self) -> dict:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        jwk.update({"kid": self.kid, "alg": "RS256", "use": "sig"})
        return {"keys": [jwk]}

    def authorize(self, query: dict[str, str]) -> tuple[int, dict, str]:
        client = self.config["client"]
        if query.get("client_id") != client["id"]:
            return 400, {}, "unknown client_id"
        redirect_uri = query.get("redirect_uri", "")
        if redirect_uri not in client["redirect_uris"]:
            return 400, {}, "redirect_uri not registered"
        state = query.get("state", "")

        def back(**params) -> tuple[int, dict, str]:
            sep = "&" if "?" in redirect_uri else "?"
            return 302, {"Location": redirect_uri + sep + urlencode({**params, "state": state})}, ""

        if query.get("response_type") != "code":
            return back(error="unsupported_response_type")
        if "openid" not in query.get("scope", "").split():
            return back(error="invalid_scope")
        challenge = query.get("code_challenge")
        if challenge and query.get("code_challenge_method") != "S256":
            return back(error="invalid_request")
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes[code] = {
                "client_id": client["id"],
                "redirect_uri": redirect_uri,
                "nonce": query.get("nonce"),
                "challenge": challenge,
                "user": dict(self.config["user"]),
                "auth_time": int(time.time()),
            }
        return back(code=code)

    def token(self, form: dict[str, str], authorization: str) -> tuple[int, dict]:
        client = self.config["client"]
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        if authorization.lower().startswith("basic "):
            decoded = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = decoded.partition(":")
        with self.lock:
            self.token_requests.append(
                {"grant_type": form.get("grant_type"), "pkce": bool(form.get("code_verifier"))}
            )
            grant = self.codes.pop(form.get("code", ""), None)  # single use, whatever follows
        if client_id != client["id"] or not hmac.compare_digest(secret.encode(), client["secret"].encode()):
            return 401, {"error": "invalid_client"}
        if form.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type"}
        if grant is None or grant["client_id"] != client_id:
            return 400, {"error": "invalid_grant"}
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri"}
        if grant["challenge"]:
            verifier = form.get("code_verifier", "")
            if _b64url(hashlib.sha256(verifier.encode()).digest()) != grant["challenge"]:
                return 400, {"error": "invalid_grant", "error_description": "code_verifier"}
        now = int(time.time())
        cfg = self.config
        claims = {
            **grant["user"],
            "iss": cfg["issuer"] or self.issuer,
            "aud": cfg["audience"] or client_id,
            "iat": now,
            "exp": now + int(cfg["expires_in"]),
            "auth_time": grant["auth_time"],
        }
        nonce = cfg["nonce"] if cfg["nonce"] is not None else grant["nonce"]
        if nonce is not None:
            claims["nonce"] = nonce
        id_token = jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})
        access_token = secrets.token_urlsafe(32)
        with self.lock:
            self.access_tokens[access_token] = dict(grant["user"])
        body = {"access_token": access_token, "token_type": "Bearer", "expires_in": 300, "id_token": id_token}
        return 200, body

    def userinfo(self, authorization: str) -> tuple[int, dict]:
        token = authorization[7:] if authorization.lower().startswith("bearer ") else ""
        user = self.access_tokens.get(token)
        if user is None:
            return 401, {"error": "invalid_token"}
        return 200, user

    def control(self, body: dict) -> None:
        with self.lock:
            for key in ("client", "user"):
                if key in body:
                    self.config[key] = dict(body[key])
            for key in ("issuer", "expires_in", "audience", "nonce"):
                if key in body:
                    self.config[key] = body[key]


class Handler(BaseHTTPRequestHandler):
    provider: Provider

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict | str = "", headers: dict | None = None) -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        content_type = "application/json" if isinstance(body, dict) else "text/plain; charset=utf-8"
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        p = self.provider
        if url.path == "/.well-known/openid-configuration":
            self._send(200, p.discovery())
        elif url.path == "/jwks":
            self._send(200, p.jwks())
        elif url.path == "/authorize":
            status, headers, text = p.authorize(query)
            self._send(status, text, headers)
        elif url.path == "/userinfo":
            self._send(*p.userinfo(self.headers.get("Authorization", "")))
        elif url.path == "/control":
            self._send(200, {**p.config, "tokenRequests": list(p.token_requests)})
        else:
            self._send(404, {"error": "not_found"})

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        p = self.provider
        if url.path == "/token":
            form = {k: v[0] for k, v in parse_qs(self._body().decode()).items()}
            self._send(*p.token(form, self.headers.get("Authorization", "")))
        elif url.path == "/control":
            p.control(json.loads(self._body() or b"{}"))
            self._send(200, {"ok": True})
        else:
            self._send(404, {"error": "not_found"})


def main(port: int) -> None:
    provider = Provider(f"http://127.0.0.1:{port}")
    handler = type("BoundHandler", (Handler,), {"provider": provider})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]))
