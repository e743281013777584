"""Schemathesis hooks (SCHEMATHESIS_HOOKS=st_hooks): a job operation may answer two
server errors, both documented and correct on a host without a GPU under fuzzed
deadlines, and no other: 503 `device_unavailable` to `"backend": "gpu"` (or its alias
`"cuda"`), and 504 `deadline_exceeded` to a deadline (`timeout_ms`) of a few milliseconds. The relaxed
`not_a_server_error` in schemathesis.toml lets them through; this check holds every
other 5xx, of any operation, to account by its problem `code`."""

import json

import schemathesis

EXPECTED_SERVER_ERRORS = {503: {"device_unavailable"}, 504: {"deadline_exceeded"}}


@schemathesis.check
def only_expected_server_errors(ctx, response, case):
    if response.status_code < 500:
        return None
    try:
        code = json.loads(response.content).get("code")
    except (ValueError, AttributeError):
        code = None
    expected = EXPECTED_SERVER_ERRORS.get(response.status_code, set())
    if code not in expected:
        raise AssertionError(
            f"{response.status_code} with code {code!r}: only "
            f"{EXPECTED_SERVER_ERRORS} are expected server errors"
        )
    if code == "device_unavailable" and (case.body or {}).get("backend") not in ("gpu", "cuda"):
        raise AssertionError("device_unavailable without backend gpu (or its alias cuda)")
    return None
