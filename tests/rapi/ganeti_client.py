"""Run Ganeti's own RAPI client (Debian's python3-ganeti-rapi) and print what it answers.

Started by the tests with Debian's /usr/bin/python3 (where the package lives), never with the
project's venv. Reads a JSON object on stdin: ``{"port", "user", "password", "cafile",
"calls": [[method, [args], {kwargs}], …]}`` and prints one JSON list, per call either
``{"ok": result}`` or ``{"error": message, "code": http_code}``.
"""

import json
import sys

from ganeti.rapi import client


@client.UsesRapiClient
def main():
    order = json.load(sys.stdin)
    config = client.GenericCurlConfig(cafile=order["cafile"], verify_hostname=True, timeout=60)
    rapi = client.GanetiRapiClient(
        "127.0.0.1",
        port=order["port"],
        username=order.get("user"),
        password=order.get("password"),
        curl_config_fn=config,
    )
    answers = []
    for method, args, kwargs in order["calls"]:
        try:
            answers.append({"ok": getattr(rapi, method)(*args, **kwargs)})
        except client.GanetiApiError as exc:
            answers.append({"error": str(exc), "code": exc.code})
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
