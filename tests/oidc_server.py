"""A small but real OpenID Connect provider for the tests, run as its own process on 127.0.0.1.

It imports nothing of this project (the standard library, `cryptography` and PyJWT) so that the relying
party (`access.oidc`) is tested against a second implementation over HTTP, as it meets a real IdP. It
behaves like the certified providers' defaults (node `oidc-provider`, Keycloak) where the relying party
can tell:

* `GET /.well-known/openid-configuration` — the discovery document (issuer = the server's own URL);
* `GET /jwks` — its RSA public key (RS256, a `kid`);
* `GET /authorize` — the authorization code flow: checks `response_type=code`, the client and its
  registered `redirect_uri`, the `openid` scope, and **requires PKCE** (S256); takes `state`, `nonce` and
  the `claims` request parameter. Without a provider session (cookie `op_session`) it answers its login
  page (`POST /login`, the user's `password`); with one it approves at once (single sign-on). An unknown
  client or redirect URI is answered 400, never redirected;
* `POST /token` (and `/oauth2/token`, to see an explicit endpoint win) — redeems the code once,
  authenticating the client **only** by its registered `token_endpoint_auth_method` (`client_secret_basic`
  by default, or `client_secret_post`), the same `redirect_uri` and the PKCE verifier; the RS256 ID token
  has `iss`, `sub`, `aud`, `exp`, `iat`, `auth_time`, `nonce` and **only the claims requested for it**
  through `claims` (the user's profile and groups are at userinfo, `amr`/`acr` nowhere unless requested);
* `GET /userinfo` — the user's claims for a bearer access token it issued (`amr`/`acr` only when
  requested for userinfo);
* `GET /end_session` — RP-initiated logout: checks the `id_token_hint` (its own signature, this client),
  the registered `post_logout_redirect_uri`, ends the browser's provider session and redirects back with
  `state`;
* `POST /control` — the test's switchboard (JSON): `client` (id, secret, redirect URIs, post-logout
  redirect URIs, token_endpoint_auth_method), `user` (the claims of the next logins), `password`, and
  what goes wrong on purpose: `issuer` (another `iss` in ID tokens), `expires_in`, `audience`, `nonce`,
  `discovery` (members replaced in the document, null removes one), `amr_at_userinfo_only`, `fail`
  (endpoint → HTTP status it answers), `delay` (endpoint → seconds before answering); `reset` forgets
  sessions and what was seen. `GET /control` returns the configuration and what was seen:
  `tokenRequests`, `authRequests`, `endSessions`, `loginPages`.

Run: `python tests/oidc_server.py PORT`; it prints `ready` when it listens.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

COOKIE = "op_session"
DEFAULTS = {
    "client": {
        "id": "",
        "secret": "",
        "redirect_uris": [],
        "post_logout_redirect_uris": [],
        "token_endpoint_auth_method": "client_secret_basic",
    },
    "user": {"sub": "user-1", "preferred_username": "alice"},
    "password": "op-password",
    "issuer": None,
    "expires_in": 300,
    "audience": None,
    "nonce": None,
    "discovery": {},
    "amr_at_userinfo_only": False,
    "fail": {},
    "delay": {},
}
PROTOCOL = ("iss", "sub", "aud", "exp", "iat", "auth_time", "nonce")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _requested(claims_param: str | None, member: str) -> set[str]:
    try:
        value = json.loads(claims_param or "{}").get(member) or {}
    except (ValueError, AttributeError):
        return set()
    return set(value) if isinstance(value, dict) else set()


class Provider:
    """The provider's state: one signing key, the registered client, the test user, sessions, codes and
    tokens, and what the relying party sent."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = secrets.token_hex(8)
        self.lock = threading.Lock()
        self.config: dict = json.loads(json.dumps(DEFAULTS))
        self.reset()

    def reset(self) -> None:
        self.sessions: dict[str, dict] = {}  # cookie → {"sub", "auth_time"}
        self.pending: dict[str, dict] = {}  # login page → the authorization request it resumes
        self.codes: dict[str, dict] = {}
        self.access_tokens: dict[str, dict] = {}
        self.seen: dict[str, list] = {
            "tokenRequests": [],
            "authRequests": [],
            "endSessions": [],
            "loginPages": [],
        }

    # ----------------------------------------------------------------------------------------------
    def discovery(self) -> dict:
        document = {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "end_session_endpoint": f"{self.issuer}/end_session",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "code_challenge_methods_supported": ["S256"],
            "scopes_supported": ["openid", "email", "profile"],
            "claims_parameter_supported": True,
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "nonce", "amr", "acr", "groups"],
        }
        for member, value in self.config["discovery"].items():
            if value is None:
                document.pop(member, None)
            else:
                document[member] = value
        return document

    def jwks(self) -> dict:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        jwk.update({"kid": self.kid, "alg": "RS256", "use": "sig"})
        return {"keys": [jwk]}

    def authorize(self, query: dict[str, str], cookie: str) -> tuple[int, dict, str]:
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

        with self.lock:
            self.seen["authRequests"].append(
                {"claims": query.get("claims"), "pkce": "code_challenge" in query}
            )
        if query.get("response_type") != "code":
            return back(error="unsupported_response_type")
        if "openid" not in query.get("scope", "").split():
            return back(error="invalid_scope")
        if not query.get("code_challenge") or query.get("code_challenge_method") != "S256":
            return back(error="invalid_request", error_description="PKCE with S256 is required")
        session = self.sessions.get(cookie)
        if session is None or session["sub"] != self.config["user"].get("sub"):
            ticket = secrets.token_urlsafe(16)
            with self.lock:
                self.pending[ticket] = dict(query)
                self.seen["loginPages"].append(time.time())
            return 200, {}, self.login_page(ticket)
        return back(code=self.issue_code(query, session))

    def login_page(self, ticket: str) -> str:
        return (
            "<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>Test IdP sign-in</title></head>"
            "<body><h1>Sign in to the Test IdP</h1><form method=post action=/login>"
            f"<input type=hidden name=ticket value={html.escape(ticket)}>"
            "<label>Username <input id=op-username name=username></label>"
            "<label>Password <input id=op-password name=password type=password></label>"
            "<button id=op-submit type=submit>Sign in</button></form></body></html>"
        )

    def login(self, form: dict[str, str]) -> tuple[int, dict, str]:
        with self.lock:
            query = self.pending.pop(form.get("ticket", ""), None)
        if query is None:
            return 400, {}, "no such sign-in"
        if not hmac.compare_digest(form.get("password", "").encode(), self.config["password"].encode()):
            return 401, {}, "wrong password"
        cookie = secrets.token_urlsafe(24)
        session = {"sub": self.config["user"].get("sub"), "auth_time": int(time.time())}
        with self.lock:
            self.sessions[cookie] = session
        status, headers, text = self.authorize(query, cookie)
        headers["Set-Cookie"] = f"{COOKIE}={cookie}; Path=/; HttpOnly; SameSite=Lax"
        return status, headers, text

    def issue_code(self, query: dict[str, str], session: dict) -> str:
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes[code] = {
                "client_id": query["client_id"],
                "redirect_uri": query["redirect_uri"],
                "nonce": query.get("nonce"),
                "challenge": query["code_challenge"],
                "user": dict(self.config["user"]),
                "auth_time": session["auth_time"],
                "id_token_claims": _requested(query.get("claims"), "id_token"),
                "userinfo_claims": _requested(query.get("claims"), "userinfo"),
            }
        return code

    def _client_auth(self, form: dict[str, str], authorization: str) -> tuple[str, str, str]:
        if authorization.lower().startswith("basic "):
            decoded = base64.b64decode(authorization[6:]).decode()
            client_id, _, secret = decoded.partition(":")
            return "client_secret_basic", unquote(client_id), unquote(secret)
        if "client_secret" in form:
            return "client_secret_post", form.get("client_id", ""), form["client_secret"]
        return "none", form.get("client_id", ""), ""

    def token(self, form: dict[str, str], authorization: str, path: str) -> tuple[int, dict]:
        client = self.config["client"]
        method, client_id, secret = self._client_auth(form, authorization)
        with self.lock:
            self.seen["tokenRequests"].append(
                {
                    "grant_type": form.get("grant_type"),
                    "pkce": bool(form.get("code_verifier")),
                    "auth": method,
                    "path": path,
                }
            )
            grant = self.codes.pop(form.get("code", ""), None)  # single use, whatever follows
        if (
            method != client["token_endpoint_auth_method"]
            or client_id != client["id"]
            or not hmac.compare_digest(secret.encode(), client["secret"].encode())
        ):
            return 401, {"error": "invalid_client"}
        if form.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type"}
        if grant is None or grant["client_id"] != client_id:
            return 400, {"error": "invalid_grant"}
        if form.get("redirect_uri") != grant["redirect_uri"]:
            return 400, {"error": "invalid_grant", "error_description": "redirect_uri"}
        verifier = form.get("code_verifier", "")
        if _b64url(hashlib.sha256(verifier.encode()).digest()) != grant["challenge"]:
            return 400, {"error": "invalid_grant", "error_description": "code_verifier"}
        now = int(time.time())
        cfg = self.config
        wanted = set() if cfg["amr_at_userinfo_only"] else grant["id_token_claims"]
        claims = {name: value for name, value in grant["user"].items() if name in wanted}
        claims.update(
            sub=grant["user"]["sub"],
            iss=cfg["issuer"] or self.issuer,
            aud=cfg["audience"] or client_id,
            iat=now,
            exp=now + int(cfg["expires_in"]),
            auth_time=grant["auth_time"],
        )
        nonce = cfg["nonce"] if cfg["nonce"] is not None else grant["nonce"]
        if nonce is not None:
            claims["nonce"] = nonce
        id_token = jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})
        access_token = secrets.token_urlsafe(32)
        released = {"amr", "acr"} & (grant["userinfo_claims"] | grant["id_token_claims"])
        if not cfg["amr_at_userinfo_only"]:
            released = {"amr", "acr"} & grant["userinfo_claims"]
        userinfo = {k: v for k, v in grant["user"].items() if k not in {"amr", "acr"} or k in released}
        with self.lock:
            self.access_tokens[access_token] = userinfo
        body = {"access_token": access_token, "token_type": "Bearer", "expires_in": 300, "id_token": id_token}
        return 200, body

    def userinfo(self, authorization: str) -> tuple[int, dict]:
        token = authorization[7:] if authorization.lower().startswith("bearer ") else ""
        user = self.access_tokens.get(token)
        if user is None:
            return 401, {"error": "invalid_token"}
        return 200, user

    def end_session(self, query: dict[str, str], cookie: str) -> tuple[int, dict, str]:
        client = self.config["client"]
        hint = query.get("id_token_hint")
        valid_hint = False
        if hint:
            try:
                jwt.decode(
                    hint,
                    self.key.public_key(),
                    algorithms=["RS256"],
                    audience=client["id"],
                    options={"verify_exp": False},
                )
                valid_hint = True
            except jwt.PyJWTError:
                return 400, {}, "invalid id_token_hint"
        redirect = query.get("post_logout_redirect_uri")
        with self.lock:
            ended = self.sessions.pop(cookie, None) is not None
            self.seen["endSessions"].append(
                {"hint": valid_hint, "state": query.get("state"), "redirect": redirect, "ended": ended}
            )
        expire = {"Set-Cookie": f"{COOKIE}=; Path=/; Max-Age=0"}
        if redirect:
            if redirect not in client["post_logout_redirect_uris"]:
                return 400, {}, "post_logout_redirect_uri not registered"
            params = {"state": query["state"]} if query.get("state") else {}
            sep = "&" if "?" in redirect else "?"
            return 302, {**expire, "Location": redirect + (sep + urlencode(params) if params else "")}, ""
        return 200, expire, "You are signed out of the Test IdP."

    def control(self, body: dict) -> None:
        with self.lock:
            if body.get("reset"):
                self.config = json.loads(json.dumps(DEFAULTS))
                self.reset()
            for key in ("client", "user"):
                if key in body:
                    self.config[key] = (
                        {**DEFAULTS.get(key, {}), **body[key]} if key == "client" else dict(body[key])
                    )
            for key in (
                "password",
                "issuer",
                "expires_in",
                "audience",
                "nonce",
                "discovery",
                "fail",
                "delay",
            ):
                if key in body:
                    self.config[key] = body[key]
            if "amr_at_userinfo_only" in body:
                self.config["amr_at_userinfo_only"] = bool(body["amr_at_userinfo_only"])


class Handler(BaseHTTPRequestHandler):
    provider: Provider

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict | str = "", headers: dict | None = None) -> None:
        data = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if isinstance(body, dict):
            content_type = "application/json"
        else:
            content_type = "text/html; charset=utf-8" if body.startswith("<!DOCTYPE") else "text/plain"
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-store")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _cookie(self) -> str:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                return value
        return ""

    def _broken(self, endpoint: str) -> bool:
        """What the test asked to go wrong at `endpoint`: a delay, a server error."""
        p = self.provider
        delay = p.config["delay"].get(endpoint)
        if delay:
            time.sleep(float(delay))
        status = p.config["fail"].get(endpoint)
        if status:
            self._send(int(status), {"error": "server_error"})
            return True
        return False

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        p = self.provider
        names = {
            "/.well-known/openid-configuration": "discovery",
            "/jwks": "jwks",
            "/userinfo": "userinfo",
            "/authorize": "authorize",
            "/end_session": "end_session",
        }
        if url.path in names and self._broken(names[url.path]):
            return
        if url.path == "/.well-known/openid-configuration":
            self._send(200, p.discovery())
        elif url.path == "/jwks":
            self._send(200, p.jwks())
        elif url.path == "/authorize":
            status, headers, text = p.authorize(query, self._cookie())
            self._send(status, text, headers)
        elif url.path == "/end_session":
            status, headers, text = p.end_session(query, self._cookie())
            self._send(status, text, headers)
        elif url.path == "/userinfo":
            self._send(*p.userinfo(self.headers.get("Authorization", "")))
        elif url.path == "/control":
            self._send(200, {**p.config, **p.seen})
        else:
            self._send(404, {"error": "not_found"})

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        p = self.provider
        if url.path in ("/token", "/oauth2/token"):
            if self._broken("token"):
                return
            form = {k: v[0] for k, v in parse_qs(self._body().decode()).items()}
            self._send(*p.token(form, self.headers.get("Authorization", ""), url.path))
        elif url.path == "/login":
            form = {k: v[0] for k, v in parse_qs(self._body().decode()).items()}
            status, headers, text = p.login(form)
            self._send(status, text, headers)
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
