"""A browser app on another origin uses the client API through CORS, in headless Chromium.

The app is scripts/qa/cors_app.html, served here from a port of its own (another origin
than the homeserver's). In the page: it reads a public value (with a non-safelisted
header, so through a preflight) and an error answer; makes its own Ed25519 key with
WebCrypto, signs up and writes with signed `fetch` calls; follows `/events-stream` with
`EventSource` and sees its write's event live; and is refused by the admin API, which
answers no cross-origin requests. Each step is checked again through the APIs, so a page
that only seems to work does not pass.

Environment (scripts/browser-test sets it): HS_CLIENT_URL, HS_ADMIN_URL,
HS_ADMIN_PASSWORD (signup mode "token": tokens come from the admin API), CHROMIUM_BIN,
CHROMEDRIVER.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import secrets
import shutil
import sys
import threading
import time
import urllib.parse

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pk_sign  # noqa: E402
from pk_sign import Key  # noqa: E402

ADMIN_URL = os.environ.get("HS_ADMIN_URL", "http://127.0.0.1:6288").rstrip("/")
CLIENT_URL = os.environ.get("HS_CLIENT_URL", "http://127.0.0.1:6286").rstrip("/")
PASSWORD = os.environ.get("HS_ADMIN_PASSWORD", "")
CHROMIUM = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
APP_DIR = os.path.dirname(os.path.abspath(__file__))

if not PASSWORD:
    pytest.skip("HS_ADMIN_PASSWORD is not set (run scripts/browser-test)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

state: dict = {}


# ---- helpers --------------------------------------------------------------------

def lower_keys(headers: dict) -> dict:
    return {name.lower(): value for name, value in headers.items()}


def admin_api(method: str, path: str):
    """(status, headers with lower-case names, parsed JSON) from the admin API."""
    status, headers, raw = pk_sign.http(method, ADMIN_URL + path, None, {"Authorization": f"Bearer {PASSWORD}"})
    return status, lower_keys(headers), (json.loads(raw) if raw else None)


def new_signup_token() -> str:
    status, _, body = admin_api("POST", "/admin/signup_tokens")
    assert status == 200, (status, body)
    return body["token"]


def until(fn, timeout: float = 10, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def in_page(driver, call: str, *args):
    """Awaits `call` (an expression using the page's `app` and `args`) in the page."""
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        " const args = Array.from(arguments).slice(0, -1);"
        f" Promise.resolve().then(() => {call})"
        " .then(done, (e) => done({pageError: `${e.name}: ${e.message}`}));",
        *args,
    )


# ---- the app's own origin and the browser ---------------------------------------------

class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def app_origin():
    """Serves scripts/qa/ (the app page) on a free port: another origin than the API's."""
    handler = functools.partial(QuietHandler, directory=APP_DIR)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def driver(app_origin):
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.exists(p) or shutil.which(p))]
    if missing:
        reason = f"not installed: {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    os.environ.setdefault("SE_OFFLINE", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    d.set_page_load_timeout(30)
    d.set_script_timeout(20)
    d.get(f"{app_origin}/cors_app.html?api={urllib.parse.quote(CLIENT_URL, safe='')}")
    yield d
    d.quit()


# ---- the steps --------------------------------------------------------------------------

def test_the_app_runs_on_another_origin(driver, app_origin):
    page = driver.execute_script("return location.origin")
    assert page == app_origin
    assert page != CLIENT_URL and page != ADMIN_URL
    assert driver.execute_script("return window.isSecureContext && !!crypto.subtle"), \
        "WebCrypto needs a secure context (loopback is one)"


def test_reads_a_public_value_and_an_error(driver):
    owner = Key.generate()
    status, _, body = pk_sign.request(CLIENT_URL, "POST", f"/signup?signup_token={new_signup_token()}", key=owner)
    assert status == 201, body
    path = "/pub/example.com/hello.txt"
    status, _, _ = pk_sign.request(CLIENT_URL, "PUT", path, b"hello, other origin", key=owner)
    assert status == 200
    _, api_headers, _ = pk_sign.request(CLIENT_URL, "GET", path, headers={"Pubky-Host": owner.public_z32})
    api_headers = lower_keys(api_headers)

    # Pubky-Host is not a CORS-safelisted header: this read goes through a preflight.
    got = in_page(driver, "app.readPublic(args[0], args[1])", owner.public_z32, path)
    assert got.get("status") == 200, got
    assert got["text"] == "hello, other origin"
    assert got["etag"] == api_headers["etag"], "ETag is exposed to the page"
    assert got["lastModified"] == api_headers["last-modified"]
    assert got["requestId"], "X-Request-Id is exposed to the page"

    # An error answer is readable too (code and message), not an opaque network error.
    missing = in_page(driver, "app.readPublic(args[0], args[1])", owner.public_z32, "/pub/example.com/none")
    assert missing["status"] == 404, missing
    assert json.loads(missing["text"])["error"] == "not_found"
    forged = in_page(driver, "app.plainFetch('PUT', '/pub/x', {Authorization: args[0]})",
                     f"Pk {owner.public_z32}:AAAA:{int(time.time())}")
    assert forged["status"] == 401, forged
    assert json.loads(forged["text"])["error"] == "invalid_signature"


def test_signs_up_writes_and_sees_the_event_live(driver):
    key = in_page(driver, "app.newKey()")
    assert isinstance(key, str) and len(key) == 52, key
    signup = in_page(driver, "app.signedFetch('POST', args[0])", f"/signup?signup_token={new_signup_token()}")
    assert signup["status"] == 201, signup
    assert json.loads(signup["text"])["public_key"] == key
    status, _, user = admin_api("GET", f"/admin/users/{key}")
    assert status == 200 and user["public_key"] == key, user

    assert in_page(driver, "app.follow(args[0])", key) is True, "the event stream opens"
    path = f"/pub/example.com/from-the-page-{secrets.token_hex(4)}.txt"
    written = in_page(driver, "app.signedFetch('PUT', args[0], args[1])", path, "written by a page")
    assert written["status"] == 200, written
    assert json.loads(written["text"])["path"] == path

    url = f"pk://{key}{path}"
    event = until(lambda: next((e for e in driver.execute_script("return app.events")
                                if e["type"] == "PUT" and e["data"].split("\n")[0] == url), None),
                  what=f"the live PUT event of {path} in the page")
    assert int(event["id"]) > 0

    # Through the API: the value is there, and the feed names the same event.
    status, _, body = pk_sign.request(CLIENT_URL, "GET", path, headers={"Pubky-Host": key})
    assert (status, body) == (200, b"written by a page")
    status, _, raw = pk_sign.request(CLIENT_URL, "GET", f"/events/?cursor={int(event['id']) - 1}&limit=1")
    feed = json.loads(raw)["events"]
    assert status == 200 and feed[0]["url"] == url and feed[0]["type"] == "PUT", feed

    # A signed read of the page's own value, and a delete, from the page.
    own = in_page(driver, "app.signedFetch('GET', args[0])", path)
    assert (own["status"], own["text"]) == (200, "written by a page")
    deleted = in_page(driver, "app.signedFetch('DELETE', args[0])", path)
    assert deleted["status"] == 200, deleted
    until(lambda: any(e["type"] == "DEL" for e in driver.execute_script("return app.events")),
          what="the live DEL event in the page")


def test_the_admin_api_refuses_other_origins(driver):
    # The admin API works (for its own page and for tools) but answers no CORS headers,
    # so a page elsewhere can neither read it nor send it a password.
    status, headers, _ = admin_api("GET", "/admin/stats")
    assert status == 200
    assert "x-request-id" in headers and "access-control-allow-origin" not in headers, headers
    with_password = in_page(driver, "app.tryFetch(args[0], {Authorization: args[1]})",
                            f"{ADMIN_URL}/admin/stats", f"Bearer {PASSWORD}")
    assert "refused" in with_password, with_password
    plain = in_page(driver, "app.tryFetch(args[0])", f"{ADMIN_URL}/admin/openapi.json")
    assert "refused" in plain, plain
