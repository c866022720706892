"""One blocking HTTP GET with a timeout (a server's /health, /v1/models, /metrics)."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answered (refused, reset, timed out)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError):
        return 0, ""
