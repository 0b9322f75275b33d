"""Signed homeserver client requests, for the QA scripts (PyNaCl for Ed25519).

    key = Key.generate()
    status, headers, body = request(base_url, "POST", "/signup?signup_token=T", key=key)

`Authorization: Pk <z32 key>:<base64 signature>:<unix seconds>` signs
`METHOD:PATH?QUERY:TIMESTAMP:hex(sha256(body))`; POST and PUT also declare
`Content-Digest: sha-256=:<base64 sha256(body)>:`. `check_vectors()` checks this
module against testdata/vectors/signed_requests.json (made by
scripts/gen_signing_vectors.py, itself independent of the Rust code).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from nacl.signing import SigningKey

ZBASE32 = "ybndrfg8ejkmcpqxot1uwisza345h769"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def z32(data: bytes) -> str:
    """z-base-32 without padding (52 characters for a 32-byte key)."""
    bits = "".join(f"{b:08b}" for b in data)
    bits += "0" * (-len(bits) % 5)
    return "".join(ZBASE32[int(bits[i:i + 5], 2)] for i in range(0, len(bits), 5))


@dataclass
class Key:
    signing: SigningKey

    @classmethod
    def generate(cls) -> "Key":
        return cls(SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> "Key":
        return cls(SigningKey(seed))

    @property
    def public_z32(self) -> str:
        return z32(bytes(self.signing.verify_key))

    def sign(self, message: bytes) -> bytes:
        return self.signing.sign(message).signature


def body_sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def authorization(key: Key, method: str, target: str, body: bytes = b"", ts: int | None = None) -> str:
    """The `Authorization` value for `method target` (path and query) with `body`."""
    ts = int(time.time()) if ts is None else ts
    message = f"{method.upper()}:{target}:{ts}:{body_sha256_hex(body)}"
    signature = base64.b64encode(key.sign(message.encode())).decode()
    return f"Pk {key.public_z32}:{signature}:{ts}"


def content_digest(body: bytes) -> str:
    return f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode()}:"


def signed_headers(key: Key, method: str, target: str, body: bytes = b"", ts: int | None = None) -> dict:
    headers = {"Authorization": authorization(key, method, target, body, ts)}
    if method.upper() in ("POST", "PUT"):
        headers["Content-Digest"] = content_digest(body)
    return headers


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 15):
    """(status, headers, body bytes); error statuses are answers, not exceptions."""
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if body is not None and method.upper() in ("POST", "PUT"):
        req.add_header("Content-Length", str(len(body)))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, dict(res.headers), res.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def request(base_url: str, method: str, target: str, body: bytes = b"", key: Key | None = None,
            headers: dict | None = None):
    """A client-API request, signed with `key` when given. `target` is path and query."""
    all_headers = dict(headers or {})
    if key is not None:
        all_headers.update(signed_headers(key, method, target, body))
    send = body if (body or method.upper() in ("POST", "PUT")) else None
    return http(method, base_url.rstrip("/") + target, send, all_headers)


def check_vectors(path: str | None = None) -> int:
    """Checks z32, messages and Authorization values against the stored vectors."""
    path = path or os.path.join(REPO, "testdata", "vectors", "signed_requests.json")
    with open(path) as f:
        vectors = json.load(f)["signed_requests"]
    for v in vectors:
        key = Key.from_seed(bytes.fromhex(v["seed_hex"]))
        assert key.public_z32 == v["public_key_z32"], v
        body = v["body_utf8"].encode()
        assert body_sha256_hex(body) == v["body_sha256_hex"], v
        got = authorization(key, v["method"], v["target"], body, v["timestamp"])
        assert got == v["authorization"], (got, v["authorization"])
    return len(vectors)


if __name__ == "__main__":
    print(f"{check_vectors()} vectors ok")
