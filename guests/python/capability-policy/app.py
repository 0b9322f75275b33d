"""The capability-policy guest in Python (WIT 0.2.0): the rules of the Rust default
guest (guests/capability-policy/src/rules.rs), to show a guest needs no Rust.

First match decides: deny-prefixes (everyone) > read-only-prefixes (writes, everyone)
> owner allowed > public may read > a session needs `<read|write|*>:<prefix>` covering
the path. A prefix ending in `/` covers its subtree, any other exactly that path.

Built by scripts/build-python-guest with componentize-py `--stub-wasi`: the component
then imports nothing but `config`, so it runs in the sandbox as it is (docs/guests.md,
"Other languages").
"""
from wit_world import exports
from wit_world.exports.policy import (
    Caller_Owner, Caller_Public, Caller_Session, Decision, Operation, Request,
)
from wit_world.imports import config

# Config never changes during an instance's life; parsed on first call (not at module
# top level: componentize-py runs top-level code at build time, where config is absent).
_rules = None


def _items(value):
    """text_fold::config_items: one item a line or comma separated, '#' comments."""
    out = []
    for line in value.split("\n"):
        for item in line.split("#", 1)[0].split(","):
            item = item.strip()
            if item:
                out.append(item)
    return out


def _load():
    global _rules
    if _rules is None:
        get = lambda key: _items(config.get(key) or "")
        _rules = (get("deny-prefixes"), get("read-only-prefixes"))
    return _rules


def covers(prefix, path):
    return path.startswith(prefix) if prefix.endswith("/") else path == prefix


def capability_allows(cap, write, path):
    action, sep, prefix = cap.partition(":")
    if not sep or not prefix:
        return False
    ok = action == "*" or action == ("write" if write else "read")
    return ok and covers(prefix, path)


def decide(req):
    deny, read_only = _load()
    path, write = req.path, req.operation == Operation.WRITE
    for p in deny:
        if covers(p, path):
            return Decision(False, f"{p} is closed by the operator")
    if write:
        for p in read_only:
            if covers(p, path):
                return Decision(False, f"{p} is read-only by operator policy")
    caller = req.caller
    if isinstance(caller, Caller_Owner):
        return Decision(True, "owner")
    if isinstance(caller, Caller_Public):
        return (Decision(False, "the public cannot write") if write
                else Decision(True, "public read"))
    if isinstance(caller, Caller_Session):
        for cap in caller.value:
            if capability_allows(cap, write, path):
                return Decision(True, f"session capability {cap}")
        op = "write" if write else "read"
        return Decision(False, f"no session capability allows {op} on {path}")
    return Decision(False, "unknown caller")


class Policy(exports.Policy):
    def authorize(self, req: Request) -> Decision:
        try:
            return decide(req)
        except Exception:  # must not trap: an exception would be a trap (HTTP 500)
            return Decision(False, "policy error")
