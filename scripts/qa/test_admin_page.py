"""The admin web page (the admin server's `/`), driven in headless Chromium.

Each step is done and checked through the page, and what it changed is checked again
through the admin API (Bearer password) or the client API (signed requests), so a page
that only looks right does not pass. The tests run in file order and share one browser:
they are one walk through the page, from sign-in to sign-out.

Environment:
  HS_ADMIN_URL        the admin server, e.g. http://127.0.0.1:6288
  HS_ADMIN_PASSWORD   its admin.password
  HS_CLIENT_URL       the client API, e.g. http://127.0.0.1:6286 (signup mode "token"
                      for the token step; in open mode that step is skipped)
  CHROMIUM_BIN, CHROMEDRIVER   default /usr/bin/chromium, /usr/bin/chromedriver
  HS_SCREENSHOT_DIR   default target/admin-page-screenshots
  HS_POLICIES_DIR     the server's policies.dir, which the test may write a module into
  HS_TEST_GUESTS      the folder of the built test guests (capability_policy.wasm)

Usually run by scripts/browser-test, which starts a server for it.
"""
from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pk_sign  # noqa: E402
from pk_sign import Key  # noqa: E402

ADMIN_URL = os.environ.get("HS_ADMIN_URL", "http://127.0.0.1:6288").rstrip("/")
CLIENT_URL = os.environ.get("HS_CLIENT_URL", "http://127.0.0.1:6286").rstrip("/")
PASSWORD = os.environ.get("HS_ADMIN_PASSWORD", "")
CHROMIUM = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
SHOTS = os.environ.get("HS_SCREENSHOT_DIR") or os.path.join(pk_sign.REPO, "target", "admin-page-screenshots")

if not PASSWORD:
    pytest.skip("HS_ADMIN_PASSWORD is not set (run scripts/browser-test)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    JavascriptException,
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

# Shared between the steps.
state: dict = {}
console: list = []


# ---- helpers: the APIs ----------------------------------------------------------

def admin_api(method: str, path: str, body=None, headers: dict | None = None, bearer: bool = True):
    """(status, parsed JSON or None) from the admin API, with the password as Bearer."""
    h = {"Accept": "application/json"}
    if bearer:
        h["Authorization"] = f"Bearer {PASSWORD}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    status, _, raw = pk_sign.http(method, ADMIN_URL + path, data, h)
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode(errors="replace")
    return status, parsed


def new_token_via_api() -> str:
    status, body = admin_api("POST", "/admin/signup_tokens")
    assert status == 200, (status, body)
    return body["token"]


def signup(key: Key, token: str | None = None) -> None:
    """Signs `key` up, with a token made through the admin API unless one is given."""
    token = token or new_token_via_api()
    status, _, body = pk_sign.request(CLIENT_URL, "POST", f"/signup?signup_token={token}", key=key)
    assert status == 201, (status, body)


def put(key: Key, path: str, data: bytes) -> int:
    status, _, _ = pk_sign.request(CLIENT_URL, "PUT", path, data, key=key)
    return status


def api_user(key: Key):
    return admin_api("GET", f"/admin/users/{key.public_z32}")


# ---- helpers: the browser -------------------------------------------------------

def until(fn, timeout: float = 10, what: str = "condition"):
    """Calls fn until it returns something truthy (elements may be re-rendered meanwhile)."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except (NoSuchElementException, StaleElementReferenceException, JavascriptException) as e:
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(0.1)


def css(driver, selector: str):
    return driver.find_element(By.CSS_SELECTOR, selector)


def visible(driver, selector: str) -> bool:
    els = driver.find_elements(By.CSS_SELECTOR, selector)
    return bool(els) and els[0].is_displayed()


def click(driver, el):
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    el.click()


def click_css(driver, selector: str):
    el = until(lambda: visible(driver, selector) and css(driver, selector), what=f"{selector} to be visible")
    click(driver, el)


def user_row(driver, key: Key):
    return css(driver, f'#users-table tr[data-key="{key.public_z32}"]')


def user_status(driver, key: Key) -> str:
    return user_row(driver, key).find_element(By.CSS_SELECTOR, ".status").text.strip()


def search_user(driver, key: Key):
    """Types the key's prefix into the search and waits for its row."""
    box = css(driver, "#user-search")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", box)
    box.clear()
    box.send_keys(key.public_z32[:12])
    # The table is busy from the first keystroke until the last one's answer is shown.
    until(lambda: css(driver, "#users-table").get_attribute("aria-busy") is None, what="the search to finish")
    return until(lambda: user_row(driver, key), what=f"the row of {key.public_z32}")


def message(driver) -> tuple[str, str]:
    box = css(driver, "#message")
    return (box.text if box.is_displayed() else ""), (box.get_attribute("class") or "")


def shot(driver, name: str, element=None, full: bool = False):
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, f"{name}.png")
    if element is not None or full:
        # The status toast is fixed to the window: out of the way of a section's picture
        # (errors stay: they are part of what the picture shows).
        driver.execute_script(
            "const m = document.getElementById('message');"
            " if (m && !m.classList.contains('message-error')) m.hidden = true;")
    if element is not None:
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'}); window.scrollBy(0, -70);", element)
        time.sleep(0.15)
        element.screenshot(path)
    elif full:
        png = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        with open(path, "wb") as f:
            f.write(base64.b64decode(png["data"]))
    else:
        driver.save_screenshot(path)
    return path


def assert_no_horizontal_overflow(driver):
    sizes = driver.execute_script(
        "return [document.body.scrollWidth, document.documentElement.scrollWidth, window.innerWidth];")
    assert sizes[0] <= sizes[2] + 1 and sizes[1] <= sizes[2] + 1, f"horizontal overflow (body, html, window): {sizes}"
    return sizes


def stat_users(driver) -> int | None:
    text = css(driver, "#stat-users").text
    digits = re.sub(r"\D", "", text)
    return int(digits) if digits else None


# ---- the browser ----------------------------------------------------------------

@pytest.fixture(scope="module")
def driver():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.exists(p) or shutil.which(p))]
    if missing:
        reason = f"not installed: {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager go online
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                "--lang=en-US", "--disable-gpu", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    d.set_page_load_timeout(30)
    yield d
    d.quit()


@pytest.fixture(autouse=True)
def _collect_console(request):
    yield
    if "driver" in request.fixturenames:
        d = request.getfixturevalue("driver")
        try:
            console.extend((request.node.name, e) for e in d.get_log("browser"))
        except WebDriverException:
            pass


# ---- the steps ------------------------------------------------------------------

def test_signing_helpers_match_vectors():
    assert pk_sign.check_vectors() >= 5


def test_page_is_served_with_strict_csp():
    status, headers, body = pk_sign.http("GET", ADMIN_URL + "/")
    assert status == 200, status
    csp = {k.lower(): v for k, v in headers.items()}.get("content-security-policy", "")
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp
    for asset in ("/admin.css", "/admin.js"):
        s, _, _ = pk_sign.http("GET", ADMIN_URL + asset)
        assert s == 200, (asset, s)
    assert b"<script src=\"/admin.js\"" in body


def test_wrong_password_is_refused(driver):
    driver.get(ADMIN_URL + "/")
    until(lambda: visible(driver, "#password"), what="the sign-in form")
    assert not visible(driver, "#stats"), "the dashboard shows before sign-in"
    assert_no_horizontal_overflow(driver)
    assert not visible(driver, "#sign-out")
    shot(driver, "sign-in")

    wrong = "not-the-password-" + secrets.token_hex(4)
    css(driver, "#password").send_keys(wrong)
    click_css(driver, "#sign-in")
    err = until(lambda: visible(driver, "#sign-in-error") and css(driver, "#sign-in-error").text,
                what="the sign-in error")
    assert "wrong password" in err.lower(), err
    assert not visible(driver, "#stats") and not visible(driver, "#dashboard")
    assert visible(driver, "#password")
    assert wrong not in driver.current_url
    shot(driver, "sign-in-refused")


def test_sign_in_shows_dashboard(driver):
    box = css(driver, "#password")
    box.clear()
    box.send_keys(PASSWORD)
    click_css(driver, "#sign-in")
    until(lambda: visible(driver, "#stats"), what="the dashboard")
    until(lambda: stat_users(driver) is not None, what="the user count")
    assert not visible(driver, "#signin") and not visible(driver, "#sign-in-error")
    assert css(driver, "#password").get_attribute("value") == "", "the password stays in the form"
    status, stats = admin_api("GET", "/admin/stats")
    assert status == 200 and stat_users(driver) == stats["users"], (stat_users(driver), stats)
    until(lambda: css(driver, "#stat-uptime").text not in ("", "–"), what="the uptime")
    assert "ok" in css(driver, "#stat-backends").text

    # The browser holds only an HttpOnly cookie: nothing in the URL or web storage.
    assert PASSWORD not in driver.current_url
    stored = driver.execute_script(
        "return [localStorage.length, sessionStorage.length, document.cookie,"
        " JSON.stringify(Object.assign({}, localStorage, sessionStorage))];")
    assert stored[0] == 0 and stored[1] == 0, stored
    assert PASSWORD not in stored[3] and "hs_admin" not in stored[2], stored
    # The cookie's path is /admin/, so the page at / does not see it: ask the browser.
    cookies = {c["name"]: c for c in driver.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]}
    assert "hs_admin" in cookies, cookies
    assert cookies["hs_admin"].get("httpOnly") is True, cookies["hs_admin"]
    assert cookies["hs_admin"].get("path") == "/admin/", cookies["hs_admin"]
    state["cookie"] = cookies["hs_admin"]["value"]

    # The cookie alone is refused: a cookie-authenticated request needs the page's header.
    s, _ = admin_api("GET", "/admin/stats", bearer=False, headers={"Cookie": f"hs_admin={state['cookie']}"})
    assert 400 <= s < 500, f"cookie without X-Homeserver-Admin answered {s}"
    s, _ = admin_api("GET", "/admin/stats", bearer=False,
                     headers={"Cookie": f"hs_admin={state['cookie']}", "X-Homeserver-Admin": "1"})
    assert s == 200, s

    until(lambda: css(driver, "#policies-table tbody tr"), what="the policies table")
    assert_no_horizontal_overflow(driver)
    shot(driver, "dashboard", full=True)

    # A reload keeps the session (GET /admin/stats answers 200: no sign-in form).
    driver.refresh()
    until(lambda: visible(driver, "#stats"), what="the dashboard after a reload")
    assert not visible(driver, "#signin")


def test_user_appears_and_is_disabled_and_enabled(driver):
    key = Key.generate()
    state["user"] = key
    before = stat_users(driver)
    signup(key)
    assert put(key, "/pub/qa-admin-page/first.txt", b"hello from the admin page test") == 200

    click_css(driver, "#refresh")
    until(lambda: stat_users(driver) == before + 1, what="the user count to go up after refresh")
    if before + 1 <= 50:  # the first page of the unfiltered list has it
        until(lambda: user_row(driver, key), what="the new user's row after refresh")
    row = search_user(driver, key)
    assert user_status(driver, key) == "active"
    assert row.find_element(By.CSS_SELECTOR, "code.key").get_attribute("title") == key.public_z32

    click(driver, user_row(driver, key).find_element(By.CSS_SELECTOR, ".disable"))
    until(lambda: user_status(driver, key) == "disabled", what="status disabled")
    status, user = api_user(key)
    assert status == 200 and user["disabled"] is True, user
    assert put(key, "/pub/qa-admin-page/refused.txt", b"x") == 403, "a disabled user could write"
    shot(driver, "users-disabled", element=css(driver, "#users"))

    click(driver, user_row(driver, key).find_element(By.CSS_SELECTOR, ".enable"))
    until(lambda: user_status(driver, key) == "active", what="status active")
    status, user = api_user(key)
    assert status == 200 and user["disabled"] is False, user
    assert put(key, "/pub/qa-admin-page/again.txt", b"writes work again") == 200
    shot(driver, "users", element=css(driver, "#users"))


def test_change_quota(driver):
    key = state["user"]
    _, user = api_user(key)
    default = user["storage_quota"]
    search_user(driver, key)

    def set_quota(text: str):
        click(driver, user_row(driver, key).find_element(By.CSS_SELECTOR, ".quota"))
        box = until(lambda: visible(driver, "#quota-input") and css(driver, "#quota-input"), what="the quota editor")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(Keys.DELETE)
        if text:
            box.send_keys(text)
        return box

    set_quota("5MB")
    assert "5,000,000" in css(driver, "#quota-preview").text, css(driver, "#quota-preview").text
    shot(driver, "users-quota-editor", element=css(driver, "#users"))
    click_css(driver, "#quota-save")
    until(lambda: not driver.find_elements(By.CSS_SELECTOR, "#quota-input"), what="the editor to close")
    until(lambda: api_user(key)[1]["storage_quota"] == 5_000_000, what="quota 5 MB in the API")
    until(lambda: "5,000,000" in user_row(driver, key).find_element(By.CSS_SELECTOR, ".quota-value").get_attribute("title"),
          what="the new quota in the row")

    set_quota("0")
    click_css(driver, "#quota-save")
    until(lambda: user_row(driver, key).find_element(By.CSS_SELECTOR, ".quota-value").text == "unlimited",
          what="quota unlimited in the row")
    assert api_user(key)[1]["storage_quota"] == 0

    # Junk is refused in the page, visibly, and changes nothing.
    set_quota("lots")
    click_css(driver, "#quota-save")
    until(lambda: "error" in message(driver)[1] and "Quota" in message(driver)[0], what="the quota error message")
    assert api_user(key)[1]["storage_quota"] == 0

    # Empty = back to the server's default.
    box = set_quota("")
    box.send_keys(Keys.ENTER)
    until(lambda: api_user(key)[1]["storage_quota"] == default, what="the default quota in the API")
    until(lambda: not driver.find_elements(By.CSS_SELECTOR, "#quota-input"), what="the editor to close")


def test_signup_token_is_created_and_used(driver):
    click_css(driver, "#create-token")
    token = until(lambda: re.fullmatch(r"[A-Z0-9]{4}-[A-Z0-9]{4}-[A-Z0-9]{4}", css(driver, "#new-token").text.strip()),
                  what="the new token").group(0)
    row_css = f'#tokens-table tr[data-token="{token}"]'
    until(lambda: css(driver, row_css + " .status").text == "valid", what="the token listed as valid")
    click_css(driver, "#copy-token")  # clipboard or selection; must not break the page
    shot(driver, "tokens-new", element=css(driver, "#tokens"))

    status, _, body = pk_sign.http("GET", f"{CLIENT_URL}/signup_tokens/{token}")
    # scripts/browser-test starts the server in token mode: the token must be valid.
    assert status == 200 and b'"valid"' in body, f"GET /signup_tokens/{token}: {status} {body[:200]!r}"
    key = Key.generate()
    state["token_user"] = key
    signup(key, token)
    click_css(driver, "#refresh")
    until(lambda: css(driver, row_css + " .status").text == "used", what="the token listed as used")
    used_by = css(driver, row_css + " .used-by code")
    assert used_by.get_attribute("title") == key.public_z32
    shot(driver, "tokens", element=css(driver, "#tokens"))


def test_reload_policies(driver):
    until(lambda: css(driver, '#policies-table tr[data-slot="capability-policy"]'), what="the capability-policy slot")
    _, expected = admin_api("GET", "/admin/policies")
    rows = driver.find_elements(By.CSS_SELECTOR, "#policies-table tbody tr")
    assert len(rows) == len(expected["slots"]), (len(rows), expected)
    # Which process calls each slot: this server only the capability policy.
    for slot in expected["slots"]:
        cell = css(driver, f'#policies-table tr[data-slot="{slot["slot"]}"] .called-by').text
        want = "this server" if slot["called_by"] == "homeserver" else "pkbot (not this server)"
        assert cell == want, (slot["slot"], cell)
        # Its call figures: a count, the latency (percentiles and a bar per bucket, or
        # "no calls"), the failures and the memory peak, as the API has them.
        row_css = f'#policies-table tr[data-slot="{slot["slot"]}"]'
        calls = css(driver, row_css + " .calls").text
        assert calls.isdigit(), (slot["slot"], calls)
        latency = css(driver, row_css + " td[data-label=Latency]").text
        assert ("p50" in latency) == (int(calls) > 0), (slot["slot"], calls, latency)
        assert css(driver, row_css + " .failures").text, slot["slot"]
        assert css(driver, row_css + " .memory-peak").text, slot["slot"]
        # The figures are the serving module's (the slot's since start in the title).
        serving = [m for m in slot["modules"] if m["serving"]]
        assert len(serving) == (1 if slot["serving"] else 0), slot
        figures = serving[0]["calls"] if serving else slot["calls"]
        if serving:
            assert serving[0]["blake3"] == slot["blake3"], slot
        cpu = css(driver, row_css + " .cpu").text
        assert cpu.startswith(f'{figures["cpu_ms"]} ms'), (slot["slot"], cpu, figures)
        title = css(driver, row_css + " .calls").get_attribute("title")
        assert "since this process started" in title, (slot["slot"], title)
    for key in ("count", "failures", "p50_ms", "p99_ms", "latency", "memory_high_water_bytes", "cpu_ms", "throttled_ms"):
        assert key in expected["slots"][0]["calls"], (key, expected["slots"][0])
        assert key in expected["slots"][0]["modules"][0]["calls"], (key, expected["slots"][0])
    click_css(driver, "#reload-policies")
    result = until(lambda: visible(driver, "#reload-result") and "Reloading" not in css(driver, "#reload-result").text
                   and css(driver, "#reload-result"), what="the reload result")
    text = result.text
    assert "capability-policy" in text, text
    outcomes = [li.get_attribute("data-outcome") for li in result.find_elements(By.CSS_SELECTOR, "li[data-slot]")]
    assert outcomes and all(o in ("unchanged", "loaded", "failed") for o in outcomes), outcomes
    assert ("Reload OK" in text) == all(o != "failed" for o in outcomes), text
    shot(driver, "policies", element=css(driver, "#policies"))


def policy_slot(answer: dict) -> dict:
    return next(s for s in answer["slots"] if s["slot"] == "capability-policy")


def reload_until(blake3_is, what: str) -> dict:
    """Reloads through the API until the capability policy's BLAKE3 passes `blake3_is`
    (the folder's watcher may have loaded it first: then the reload says unchanged)."""
    def loaded():
        status, answer = admin_api("POST", "/admin/policies/reload")
        assert status == 200, (status, answer)
        slot = policy_slot({"slots": answer["status"]})
        return slot if blake3_is(slot["blake3"]) else None
    return until(loaded, timeout=20, what=what)


def test_a_swapped_module_has_figures_of_its_own(driver):
    """A hot swap on the page: the row's figures are the new module's, and the module
    before it is listed under the BLAKE3 with its own."""
    policies, guests = os.environ.get("HS_POLICIES_DIR"), os.environ.get("HS_TEST_GUESTS")
    assert policies and guests, "HS_POLICIES_DIR and HS_TEST_GUESTS (set by scripts/browser-test)"
    _, before = admin_api("GET", "/admin/policies")
    old = policy_slot(before)["blake3"]
    old_calls = policy_slot(before)["modules"][0]["calls"]["count"]
    assert old_calls > 0, before  # the earlier steps wrote values
    # The same guest under another BLAKE3 (a custom section appended), so the steps
    # after this one see the same decisions.
    with open(os.path.join(guests, "capability_policy.wasm"), "rb") as f:
        module = f.read()
    name = b"browser-test"
    module += bytes([0, len(name) + 1, len(name)]) + name
    target = os.path.join(policies, "capability-policy.wasm")
    with open(target + ".tmp", "wb") as f:
        f.write(module)
    os.replace(target + ".tmp", target)
    row_css = '#policies-table tr[data-slot="capability-policy"]'
    try:
        slot = reload_until(lambda b: b != old, "the new module to serve")
        new = slot["blake3"]
        assert [(m["blake3"], m["serving"]) for m in slot["modules"]] == [(new, True), (old, False)], slot
        click_css(driver, "#reload-policies")
        until(lambda: css(driver, row_css + " td[data-label=BLAKE3] code").get_attribute("title") == new,
              what="the row showing the new module")
        # The figures are the new module's (no calls yet), not the slot's.
        _, now = admin_api("GET", "/admin/policies")
        serving = policy_slot(now)["modules"][0]
        assert css(driver, row_css + " .calls").text == str(serving["calls"]["count"]), now
        assert serving["calls"]["count"] < old_calls, now
        earlier = css(driver, row_css + " .earlier-modules")
        assert earlier.find_element(By.CSS_SELECTOR, "summary").text == "1 earlier"
        click(driver, earlier.find_element(By.CSS_SELECTOR, "summary"))
        item = until(lambda: visible(driver, row_css + f' .earlier-modules li[data-blake3="{old}"]')
                     and css(driver, row_css + f' .earlier-modules li[data-blake3="{old}"]'),
                     what="the earlier module's line")
        assert f"{old_calls} calls" in item.text, item.text
        shot(driver, "policies-after-a-swap", element=css(driver, "#policies"))
    finally:
        os.remove(target)
    # Back to the built-in module (the fallback): its own figures carry on.
    slot = reload_until(lambda b: b == old, "the built-in module to serve again")
    assert slot["modules"][0]["calls"]["count"] >= old_calls, slot
    assert slot["modules"][0]["loads"] == 2, slot


def test_events_show_a_put(driver):
    key = state["user"]
    path = f"/pub/qa-admin-page/event-{secrets.token_hex(4)}.txt"
    assert put(key, path, b"an event for the admin page") == 200
    click_css(driver, "#refresh")

    # Read in one script: the table re-renders every 10 s, so elements found in one
    # call may be gone in the next.
    def the_row():
        return driver.execute_script("""
            const row = [...document.querySelectorAll('#events-table tbody tr')]
              .find(tr => tr.dataset.url.endsWith(arguments[0]) && tr.dataset.type === 'PUT');
            return row ? {url: row.dataset.url, text: row.textContent} : null;""", path)

    row = until(the_row, what=f"a PUT event for {path}")
    assert key.public_z32 in row["url"]
    assert path in row["text"]
    shot(driver, "events", element=css(driver, "#events"))
    css(driver, "#user-search").clear()
    css(driver, "#user-search").send_keys(Keys.ENTER)
    until(lambda: css(driver, "#users-table tbody tr"), what="users listed")
    shot(driver, "dashboard-in-use", full=True)


def test_delete_user_through_the_confirmation(driver):
    key = Key.generate()
    signup(key)
    for i in range(2):
        assert put(key, f"/pub/qa-admin-page/doomed-{i}.txt", b"to be deleted") == 200
    click_css(driver, "#refresh")
    search_user(driver, key)

    click(driver, user_row(driver, key).find_element(By.CSS_SELECTOR, ".delete"))
    until(lambda: visible(driver, "#delete-confirm"), what="the confirmation panel")
    assert css(driver, "#delete-confirm-key").text == key.public_z32
    shot(driver, "delete-confirm")
    click_css(driver, "#delete-confirm-no")
    until(lambda: not visible(driver, "#delete-confirm"), what="the panel to close")
    assert user_row(driver, key) and api_user(key)[0] == 200, "cancel deleted the user"

    click(driver, user_row(driver, key).find_element(By.CSS_SELECTOR, ".delete"))
    click_css(driver, "#delete-confirm-yes")
    until(lambda: not driver.find_elements(By.CSS_SELECTOR, f'#users-table tr[data-key="{key.public_z32}"]'),
          what="the row to go")
    assert not visible(driver, "#delete-confirm")
    until(lambda: "Deleted" in message(driver)[0], what="the deletion message")
    assert api_user(key)[0] == 404

    # An API error is shown: a user deleted behind the page's back, then disabled in it.
    ghost = Key.generate()
    signup(ghost)
    search_user(driver, ghost)
    status, _ = admin_api("DELETE", f"/admin/users/{ghost.public_z32}")
    assert status == 200
    click(driver, user_row(driver, ghost).find_element(By.CSS_SELECTOR, ".disable"))
    text, cls = until(lambda: "message-error" in message(driver)[1] and message(driver), what="the API error")
    assert "not_found" in text and "404" in text, text
    shot(driver, "api-error")
    click_css(driver, "#message-close")


def test_phone_layout(driver):
    search = css(driver, "#user-search")
    search.clear()
    search.send_keys(Keys.ENTER)
    until(lambda: css(driver, "#users-table tbody tr"), what="users listed")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    try:
        driver.execute_script("window.scrollTo(0, 0);")
        until(lambda: driver.execute_script("return window.innerWidth") <= 400, what="the phone viewport")
        sizes = assert_no_horizontal_overflow(driver)
        assert sizes[2] <= 400, f"the emulated viewport is {sizes[2]} px wide"
        # Tables collapse into cards: no header row, each cell labelled.
        assert not css(driver, "#users-table thead").is_displayed()
        wide = driver.execute_script("""
            return [...document.querySelectorAll('#dashboard *')]
              .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1 && e.offsetParent !== null)
              .slice(0, 5).map(e => e.tagName + '#' + e.id + '.' + e.className);""")
        assert not wide, f"elements wider than the screen: {wide}"
        shot(driver, "phone")
        for section in ("users", "tokens", "policies", "events"):
            driver.execute_script("document.getElementById(arguments[0]).scrollIntoView({block: 'start'});"
                                  " window.scrollBy(0, -60);", section)
            time.sleep(0.1)
            shot(driver, f"phone-{section}")
        shot(driver, "phone-full", full=True)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_users_load_more(driver):
    # More users than a page (50): the rest come with "Load more", none twice.
    _, stats = admin_api("GET", "/admin/stats")
    for _ in range(max(0, 53 - stats["users"])):
        signup(Key.generate())
    _, stats = admin_api("GET", "/admin/stats")
    total = stats["users"]
    search = css(driver, "#user-search")
    search.clear()
    search.send_keys(Keys.ENTER)
    until(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#users-table tbody tr[data-key]")) == 50,
          what="the first page of 50 users")
    click_css(driver, "#users-more")
    until(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#users-table tbody tr[data-key]")) == total,
          what=f"all {total} users after load more")
    keys = [tr.get_attribute("data-key") for tr in driver.find_elements(By.CSS_SELECTOR, "#users-table tbody tr[data-key]")]
    assert len(set(keys)) == total and keys == sorted(keys), "users repeated or out of key order"
    until(lambda: not visible(driver, "#users-more"), what="no more pages")


def test_sign_out(driver):
    click_css(driver, "#sign-out")
    until(lambda: visible(driver, "#password"), what="the sign-in form after sign-out")
    assert not visible(driver, "#dashboard") and not visible(driver, "#sign-out")
    assert not driver.find_elements(By.CSS_SELECTOR, "#users-table tbody tr"), "user data left in the page"
    # The server forgot the session: the old cookie is refused.
    s, _ = admin_api("GET", "/admin/stats", bearer=False,
                     headers={"Cookie": f"hs_admin={state['cookie']}", "X-Homeserver-Admin": "1"})
    assert s == 401, f"the signed-out session still answers {s}"
    driver.refresh()
    until(lambda: visible(driver, "#password"), what="the sign-in form after a reload")
    assert not visible(driver, "#stats")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    try:
        until(lambda: driver.execute_script("return window.innerWidth") <= 400, what="the phone viewport")
        assert assert_no_horizontal_overflow(driver)[2] <= 400
        shot(driver, "phone-sign-in")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_no_script_or_csp_errors_in_the_console(driver):
    bad = [(test, e["message"]) for test, e in console
           if e.get("level") == "SEVERE" and re.search(r"Content Security Policy|Uncaught|TypeError|ReferenceError|SyntaxError", e["message"])]
    assert not bad, "\n".join(f"{t}: {m}" for t, m in bad)
