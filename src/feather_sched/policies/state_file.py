"""A learning policy's saved state: a JSON file a deployment starts warm from."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_VERSION = 4


def write_state(path: str | Path, policy: str, state: dict[str, Any]) -> Path:
    """Write `policy`'s `state` atomically: a server saving while another process loads, or
    a crash mid-write, never leaves a half-written file."""
    path = Path(path)
    payload = {"version": STATE_VERSION, "policy": policy, **state}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left over when the write failed
    return path


def read_state(path: str | Path, policy: str) -> dict[str, Any]:
    """A saved state of `policy`, checked; FileNotFoundError/ValueError say why it cannot be
    loaded."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"policy state file not found: {path}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a Feather policy state (bad JSON: {err})") from None
    if payload.get("policy") != policy or payload.get("version") != STATE_VERSION:
        raise ValueError(
            f"{path}: not a version-{STATE_VERSION} {policy!r} policy state "
            f"(policy={payload.get('policy')!r}, version={payload.get('version')!r}); "
            "tables saved before version 4 hold the old UCB bandit's statistics and "
            "cannot be read: delete the file to start cold"
        )
    return payload
