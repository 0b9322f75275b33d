"""Fuzzes a running homeserver against its OpenAPI documents (schemathesis 4).

Run through scripts/fuzz-api, which builds and starts a server and sets:

    HS_FUZZ_URL             the client API, e.g. http://127.0.0.1:6286
    HS_FUZZ_ADMIN_URL       the admin API, e.g. http://127.0.0.1:6288
    HS_FUZZ_ADMIN_PASSWORD  its password
    HS_FUZZ_MAX_EXAMPLES    generated cases per operation (default 25)
    HS_FUZZ_SHRINK=1        shrink failing cases to a minimal example (slower)

What runs, in order:

1. the documents are valid OpenAPI 3.1; the signing code matches testdata/vectors;
2. a fresh Ed25519 key signs up; every client operation is fuzzed with requests signed
   as that key (`Authorization: Pk ...`, `Content-Digest` on POST/PUT; GET and DELETE of
   /auth/session get a real session token instead), checking: no 5xx, and the status
   code, content type, headers and body are documented;
3. requests a generator does not make (non-UTF-8 path parameters, bodies of megabytes, a
   body that does not match its digest), judged by the same checks;
4. a fixed scenario (PUT, list, GET, HEAD, 304, public read, DELETE, feed) and a
   schemathesis state machine over the PUT -> GET/HEAD/DELETE links;
5. every admin operation is fuzzed with the admin password, except those that change or
   delete users, reload policies or sign in (random passwords would brake this address):
   those run with fixed inputs, the user actions on a throwaway user;
6. the admin page's cookie sign-in and sign-out;
7. the fuzzing user's `storage_used` (admin API) equals the sum of the sizes in its full
   listing, and its `GET /account` says the same.

Routes the server does not serve yet (404 on a probe) are skipped, with the reason.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from nacl.signing import SigningKey
from schemathesis import checks

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DOC = ROOT / "host/server/openapi/client.json"
ADMIN_DOC = ROOT / "host/server/openapi/admin.json"
VECTORS = ROOT / "testdata/vectors/signed_requests.json"

CLIENT_URL = os.environ.get("HS_FUZZ_URL", "").rstrip("/")
ADMIN_URL = os.environ.get("HS_FUZZ_ADMIN_URL", "").rstrip("/")
ADMIN_PASSWORD = os.environ.get("HS_FUZZ_ADMIN_PASSWORD", "")
MAX_EXAMPLES = int(os.environ.get("HS_FUZZ_MAX_EXAMPLES", "25"))
SHRINK = os.environ.get("HS_FUZZ_SHRINK", "") not in ("", "0")

if not CLIENT_URL:
    pytest.skip("HS_FUZZ_URL is not set (run scripts/fuzz-api)", allow_module_level=True)

# The checks every response must pass.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]

PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + ([Phase.shrink] if SHRINK else [])
FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    phases=PHASES,
    suppress_health_check=list(HealthCheck),
)
# A live event stream never ends by itself: read it this long (seconds) and judge what came.
STREAM_SECONDS = 1.0
TIMEOUT = 10.0

# --- keys and signatures ------------------------------------------------------------------

ZBASE32 = "ybndrfg8ejkmcpqxot1uwisza345h769"


def z32(data: bytes) -> str:
    """z-base-32, most significant bit first, zero-padded to a multiple of 5 bits."""
    value = int.from_bytes(data, "big")
    bits = len(data) * 8
    pad = -bits % 5
    value <<= pad
    return "".join(ZBASE32[(value >> (5 * i)) & 31] for i in reversed(range((bits + pad) // 5)))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def authorization(key: SigningKey, method: str, target: str, ts: int, body: bytes) -> str:
    """`Pk <z32>:<sig>:<ts>` over `METHOD:TARGET:TS:hex(sha256(body))`."""
    message = f"{method}:{target}:{ts}:{hashlib.sha256(body).hexdigest()}"
    signature = key.sign(message.encode()).signature
    return f"Pk {z32(bytes(key.verify_key))}:{b64(signature)}:{ts}"


def body_bytes(body) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"cannot sign a streamed body ({type(body).__name__})")


class PkAuth(requests.auth.AuthBase):
    """Signs each request as it is sent (so every write carries a fresh signature).

    Write signatures are accepted once, and Ed25519 signatures are deterministic: two
    identical writes signed in the same second would be the same signature, and the
    second a replay. So a repeated (method, target, body) walks its timestamp back one
    second at a time (the server accepts 300 s either way).
    """

    WRITES = ("POST", "PUT", "DELETE")

    def __init__(self, key: SigningKey, base_url: str):
        self.key = key
        self.public_key = z32(bytes(key.verify_key))
        self.base_url = base_url
        self._used: dict[tuple[str, str, str], set[int]] = {}
        self._lock = threading.Lock()
        self._session_token: str | None = None

    def _timestamp(self, method: str, target: str, body: bytes) -> int:
        now = int(time.time())
        if method not in self.WRITES:
            return now
        key = (method, target, hashlib.sha256(body).hexdigest())
        with self._lock:
            used = self._used.setdefault(key, set())
            used.difference_update({t for t in used if t < now - 600})
            ts = now
            while ts in used:
                ts -= 1
            if now - ts > 250:
                raise RuntimeError(f"too many identical signed writes within 250 s: {key}")
            used.add(ts)
            return ts

    def sign(self, method: str, target: str, body: bytes) -> dict[str, str]:
        method = method.upper()
        headers = {"Authorization": authorization(self.key, method, target, self._timestamp(method, target, body), body)}
        if method in ("POST", "PUT"):
            headers["Content-Digest"] = f"sha-256=:{b64(hashlib.sha256(body).digest())}:"
        return headers

    def mint_session(self, capabilities=("*:/pub/",), ttl=3600) -> str:
        body = json.dumps({"capabilities": list(capabilities), "ttl": ttl}).encode()
        response = requests.post(
            f"{self.base_url}/auth/session",
            data=body,
            headers={"Content-Type": "application/json"},
            auth=self,
            timeout=TIMEOUT,
        )
        assert response.status_code == 200, f"POST /auth/session: {response.status_code} {response.text}"
        return response.json()["token"]

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        method = request.method.upper()
        if urlsplit(request.url).path == "/auth/session" and method in ("GET", "DELETE"):
            # Session endpoints take a Bearer token: a lasting one to show, a new one to revoke.
            if method == "DELETE":
                token = self.mint_session()
            else:
                if self._session_token is None:
                    self._session_token = self.mint_session()
                token = self._session_token
            request.headers["Authorization"] = f"Bearer {token}"
            request.headers.pop("Content-Digest", None)
            return request
        body = body_bytes(request.body)
        for name, value in self.sign(method, request.path_url, body).items():
            request.headers[name] = value
        return request


class BearerAuth(requests.auth.AuthBase):
    def __init__(self, token: str):
        self.token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {self.token}"
        return request


def new_user() -> PkAuth:
    return PkAuth(SigningKey.generate(), CLIENT_URL)


USER = new_user()
ADMIN = BearerAuth(ADMIN_PASSWORD)


def sign_up(user: PkAuth) -> None:
    response = requests.post(f"{CLIENT_URL}/signup", data=b"", auth=user, timeout=TIMEOUT)
    assert response.status_code in (200, 201), f"POST /signup: {response.status_code} {response.text}"
    assert response.json()["public_key"] == user.public_key


@functools.cache
def signed_up() -> str:
    """Signs the fuzzing user up once."""
    sign_up(USER)
    return USER.public_key


# --- schemas ------------------------------------------------------------------------------


def load(path: Path, base_url: str):
    schema = schemathesis.openapi.from_path(path)
    schema.config.update(base_url=base_url, request_timeout=TIMEOUT)
    # Credentials come from the auth objects; generated Authorization values would only be
    # overwritten (and admin cookies might shadow the password).
    schema.config.generation.update(with_security_parameters=False)
    return schema


client_schema = load(CLIENT_DOC, CLIENT_URL)
admin_schema = load(ADMIN_DOC, ADMIN_URL or "http://127.0.0.1:9")

def validate(case, auth, **kwargs):
    return case.call_and_validate(checks=CHECKS, auth=auth, timeout=kwargs.pop("timeout", TIMEOUT), **kwargs)


def call(operation_id: str, schema=None, auth=None, **case_kwargs):
    """One documented call with fixed inputs, validated like the fuzzed ones."""
    operation = operation_by_id(schema or client_schema, operation_id)
    return validate(operation.Case(**case_kwargs), auth if auth is not None else USER)


def header(response, name: str) -> str:
    """A header of a schemathesis response (lower-case keys, lists of values)."""
    return response.headers[name.lower()][0]


def operation_by_id(schema, operation_id: str):
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.definition.raw.get("operationId") == operation_id:
            return operation
    raise KeyError(operation_id)


class NoAuth(requests.auth.AuthBase):
    """No credentials at all (a public read, a login)."""

    def __call__(self, request):
        request.headers.pop("Authorization", None)
        return request


def needs_admin_mark():
    return pytest.mark.skipif(not (ADMIN_URL and ADMIN_PASSWORD), reason="HS_FUZZ_ADMIN_URL/_PASSWORD not set")


# --- 1. documents and signing ---------------------------------------------------------------


def test_documents_are_valid_openapi():
    from openapi_spec_validator import validate as validate_spec

    for path in (CLIENT_DOC, ADMIN_DOC):
        validate_spec(json.loads(path.read_text()))


def test_signing_matches_vectors():
    for v in json.loads(VECTORS.read_text())["signed_requests"]:
        key = SigningKey(bytes.fromhex(v["seed_hex"]))
        assert z32(bytes(key.verify_key)) == v["public_key_z32"]
        body = v["body_utf8"].encode()
        assert authorization(key, v["method"], v["target"], v["timestamp"], body) == v["authorization"]


# --- 2. the client API ----------------------------------------------------------------------


@client_schema.parametrize()
@FUZZ_SETTINGS
def test_client_api(case):
    signed_up()
    timeout = STREAM_SECONDS if case.operation.path == "/events-stream" else TIMEOUT
    validate(case, USER, timeout=timeout)


# Requests a generator does not make (bytes that are not UTF-8 once percent-decoded, bodies
# of megabytes, a body that does not match its declared digest), sent raw and judged by
# the same checks against the documented operation.
BIG = b" " * (3 * 1024 * 1024)


def digest_mismatch():
    headers = USER.sign("PUT", "/pub/qa-edge-digest", b"declared")
    return {"data": b"sent", "headers": headers}


EDGE_CASES = [
    ("client", "signupTokenStatus", "GET", "/signup_tokens/%FF", lambda: {}),
    ("client", "listRoot", "GET", "/pub/?cursor=%FF", lambda: {"auth": USER}),
    ("client", "eventFeed", "GET", "/events/?cursor=18446744073709551615", lambda: {}),
    ("client", "putEntry", "PUT", "/pub/qa-edge-digest", digest_mismatch),
    ("client", "putEntry", "PUT", "/pub/qa-edge-big", lambda: {"auth": USER, "data": BIG * 4}),
    ("client", "signup", "POST", "/signup", lambda: {"auth": USER, "data": BIG}),
    ("admin", "adminGetUser", "GET", "/admin/users/%FF", lambda: {"auth": ADMIN}),
    ("admin", "adminEnableUser", "POST", "/admin/users/%FF/enable", lambda: {"auth": ADMIN}),
    ("admin", "adminSetQuota", "PUT", "/admin/users/{key}/quota", lambda: {"auth": ADMIN, "data": BIG}),
    ("admin", "adminLogin", "POST", "/admin/session",
     lambda: {"data": BIG, "headers": {"X-Homeserver-Admin": "1"}}),
]


@pytest.mark.parametrize(
    "api,operation_id,method,target,make",
    [
        pytest.param(*edge, id=f"{edge[2]} {edge[3]}",
                     marks=[needs_admin_mark()] if edge[0] == "admin" else [])
        for edge in EDGE_CASES
    ],
)
def test_edge_request(api, operation_id, method, target, make):
    signed_up()
    base, schema = (CLIENT_URL, client_schema) if api == "client" else (ADMIN_URL, admin_schema)
    target = target.replace("{key}", new_user().public_key)
    kwargs = make()
    kwargs.setdefault("headers", {})
    response = requests.request(method, base + target, timeout=TIMEOUT, **kwargs)
    operation = operation_by_id(schema, operation_id)
    path_parameters = {p.name: "edge" for p in operation.iter_parameters() if str(p.location).lower().endswith("path")}
    case = operation.Case(path_parameters=path_parameters)
    try:
        case.validate_response(response, checks=CHECKS)
    except Exception as failure:
        raise AssertionError(
            f"{method} {target} ({len(kwargs.get('data') or b'')} body bytes) answered "
            f"{response.status_code} {response.headers.get('Content-Type')}: {response.text[:200]!r}"
        ) from failure


# --- 3. stateful ----------------------------------------------------------------------------


def test_scenario_put_list_get_delete():
    signed_up()
    name = f"qa-scenario-{int(time.time() * 1000)}.txt"
    path = f"/pub/{name}"
    value = b"hello, schemathesis"

    feed = call("eventFeed", query={"limit": 1})
    put = call("putEntry", path_parameters={"path": name}, body=value, media_type="application/octet-stream")
    assert put.status_code == 200, put.text
    assert put.json()["path"] == path and put.json()["size"] == len(value)

    listing = call("listRoot", query={"limit": 1000})
    assert listing.status_code == 200
    entries = {e["path"]: e for e in listing.json()["entries"]}
    # The whole space may hold more than a page; page to the entry if needed.
    cursor = listing.json()["cursor"]
    while path not in entries and listing.json()["has_more"]:
        listing = call("listRoot", query={"limit": 1000, "cursor": cursor})
        entries.update({e["path"]: e for e in listing.json()["entries"]})
        cursor = listing.json()["cursor"]
    assert path in entries and entries[path]["size"] == len(value)

    got = call("getEntry", path_parameters={"path": name})
    assert got.status_code == 200 and got.content == value
    etag = header(got, "ETag")
    assert etag == f'"{entries[path]["content_hash"]}"'
    head = call("headEntry", path_parameters={"path": name})
    assert head.status_code == 200 and header(head, "Content-Length") == str(len(value))
    cached = call("getEntry", path_parameters={"path": name}, headers={"If-None-Match": f"W/{etag}"})
    assert cached.status_code == 304

    public = call("getEntry", auth=NoAuth(), path_parameters={"path": name},
                  headers={"Pubky-Host": USER.public_key})
    assert public.status_code == 200 and public.content == value
    anonymous = call("getEntry", auth=NoAuth(), path_parameters={"path": name})
    assert anonymous.status_code == 401

    deleted = call("deleteEntry", path_parameters={"path": name})
    assert deleted.status_code == 200 and deleted.json()["path"] == path
    assert call("getEntry", path_parameters={"path": name}).status_code == 404
    assert call("deleteEntry", path_parameters={"path": name}).status_code == 404

    after = call("eventFeed", query={"cursor": max(feed.json()["cursor"] - 1, 0), "limit": 1000})
    mine = [e for e in after.json()["events"] if e["url"] == f"pk://{USER.public_key}{path}"]
    assert [e["type"] for e in mine][-2:] == ["PUT", "DEL"], mine


# Chains of PUT -> GET/HEAD/DELETE of the same path (the document's links), valid inputs
# only, all in the fuzzing user's own space (a random Pubky-Host would only turn writes into
# 403 and reads into someone else's 404).
stateful_schema = load(CLIENT_DOC, CLIENT_URL).include(
    operation_id=["putEntry", "getEntry", "headEntry", "deleteEntry", "listRoot"]
)
stateful_schema.config.generation.update(modes=["positive"])


class EntryMachine(stateful_schema.as_state_machine()):
    def setup(self):
        signed_up()

    def before_call(self, case):
        for name in list(case.headers or {}):
            if name.lower() == "pubky-host":
                del case.headers[name]
        if case.query:
            case.query.pop("pubky-host", None)

    def get_call_kwargs(self, case):
        return {"auth": USER, "timeout": TIMEOUT}

    def validate_response(self, response, case, additional_checks=None, **kwargs):
        case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)


def test_stateful_entries():
    EntryMachine.run(
        settings=settings(
            max_examples=max(MAX_EXAMPLES // 2, 5),
            stateful_step_count=8,
            deadline=None,
            database=None,
            phases=PHASES,
            suppress_health_check=list(HealthCheck),
        )
    )


# --- 4. the admin API -----------------------------------------------------------------------

needs_admin = needs_admin_mark()

# Not fuzzed: changing or deleting users (possibly the fuzzing user, whose key the admin
# API lists) and reloading policies run once each, on a throwaway user, below; signing in
# with random passwords would brake this address (10 wrong passwords a minute, then every
# password is refused with 429), so sign-in is tested below with fixed inputs.
NOT_FUZZED = ["adminDeleteUser", "adminDisableUser", "adminSetQuota", "adminReloadPolicies", "adminLogin"]
admin_fuzz_schema = admin_schema.exclude(operation_id=NOT_FUZZED)


@needs_admin
@admin_fuzz_schema.parametrize()
@FUZZ_SETTINGS
def test_admin_api(case):
    validate(case, ADMIN)


@needs_admin
def test_admin_user_actions_on_a_throwaway_user():
    victim = new_user()
    sign_up(victim)
    written = requests.put(f"{CLIENT_URL}/pub/qa/one", data=b"12345", auth=victim, timeout=TIMEOUT)
    assert written.status_code == 200, written.text
    key = {"public_key": victim.public_key}

    def admin(operation_id, **kwargs):
        return call(operation_id, schema=admin_schema, auth=ADMIN, **kwargs)

    user = admin("adminGetUser", path_parameters=key).json()
    assert user["storage_used"] == 5 and not user["disabled"]

    assert admin("adminDisableUser", path_parameters=key).json()["disabled"] is True
    refused = requests.put(f"{CLIENT_URL}/pub/qa/two", data=b"x", auth=victim, timeout=TIMEOUT)
    assert refused.status_code == 403, refused.text
    assert admin("adminEnableUser", path_parameters=key).json()["disabled"] is False

    quota = admin("adminSetQuota", path_parameters=key, body={"quota_bytes": 12345}, media_type="application/json")
    assert quota.json()["storage_quota"] == 12345
    assert admin("adminSetQuota", path_parameters=key, body={}, media_type="application/json").status_code == 400
    admin("adminSetQuota", path_parameters=key, body={"quota_bytes": None}, media_type="application/json")

    reload = admin("adminReloadPolicies")
    assert reload.status_code == 200

    deleted = admin("adminDeleteUser", path_parameters=key)
    assert deleted.json() == {"public_key": victim.public_key, "entries_deleted": 1}
    assert admin("adminGetUser", path_parameters=key).status_code == 404
    assert admin("adminDeleteUser", path_parameters=key).status_code == 404
    assert admin("adminDeleteUser", path_parameters={"public_key": "not-a-key"}).status_code == 400


# --- 5. the admin page's login --------------------------------------------------------------


@needs_admin
def test_admin_cookie_login():
    def admin(operation_id, **kwargs):
        return call(operation_id, schema=admin_schema, auth=NoAuth(), **kwargs)

    def sign_in(password, csrf="1"):
        headers = {"X-Homeserver-Admin": csrf} if csrf is not None else {}
        return admin("adminLogin", headers=headers, body={"password": password}, media_type="application/json")

    no_header = sign_in(ADMIN_PASSWORD, csrf=None)
    assert no_header.status_code == 400, no_header.text
    wrong = sign_in(ADMIN_PASSWORD + "x")
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_signature", wrong.text
    bad = requests.post(f"{ADMIN_URL}/admin/session", data=b"{", timeout=TIMEOUT,
                        headers={"Content-Type": "application/json", "X-Homeserver-Admin": "1"})
    assert bad.status_code == 400, bad.text

    login = sign_in(ADMIN_PASSWORD)
    assert login.status_code == 204, login.text
    set_cookie = header(login, "Set-Cookie")
    for part in ("hs_admin=", "HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"):
        assert part in set_cookie, set_cookie
    token = set_cookie.split(";", 1)[0].removeprefix("hs_admin=")
    cookie = {"hs_admin": token}

    stats = call("adminStats", schema=admin_schema, auth=NoAuth(), cookies=cookie,
                 headers={"X-Homeserver-Admin": "1"})
    assert stats.status_code == 200, stats.text
    # The cookie alone (what a cross-site form sends) does not act.
    without_header = call("adminStats", schema=admin_schema, auth=NoAuth(), cookies=cookie)
    assert without_header.status_code == 403, without_header.text
    assert without_header.json()["error"] == "insufficient_permissions"

    logout = admin("adminLogout", cookies=cookie)
    assert logout.status_code == 204, logout.text
    assert "Max-Age=0" in header(logout, "Set-Cookie")
    ended = call("adminStats", schema=admin_schema, auth=NoAuth(), cookies=cookie,
                 headers={"X-Homeserver-Admin": "1"})
    assert ended.status_code == 401, ended.text


# --- 6. accounting --------------------------------------------------------------------------


@needs_admin
def test_storage_used_is_the_sum_of_the_listing():
    key = signed_up()
    total, count, cursor = 0, 0, None
    while True:
        query = "?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        page = requests.get(f"{CLIENT_URL}/pub/{query}", auth=USER, timeout=TIMEOUT)
        assert page.status_code == 200, page.text
        body = page.json()
        total += sum(e["size"] for e in body["entries"])
        count += len(body["entries"])
        if not body["has_more"]:
            break
        cursor = body["cursor"]
    user = requests.get(f"{ADMIN_URL}/admin/users/{key}", auth=ADMIN, timeout=TIMEOUT)
    assert user.status_code == 200, user.text
    assert count > 0, "the fuzzing left no entry to account for"
    assert user.json()["storage_used"] == total, f"{count} entries sum to {total} bytes; admin says {user.json()}"
    account = requests.get(f"{CLIENT_URL}/account", auth=USER, timeout=TIMEOUT)
    assert account.json()["used_bytes"] == total, account.json()
