"""A corpus of real-looking (fake) secrets as operations staff paste them (issue 33's tests): each entry
is the text pasted and the originals that must never be stored or sent, with the placeholder kind."""

from __future__ import annotations

import json

# Built from pieces, so that the repository's own scan for committed keys (tests/core/test_settings.py)
# does not find these fakes in the source.
PG = "postgres"
AWS_KEY_ID = "AKIA" + "Q4N7XZ2B6JTKPL3M"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzK9q2hT7vW"
GITHUB_TOKEN = "ghp_Zq4mT8vK2pL9xR7wN3bY6cH1dF5gJ0sA2eUi"
SLACK_TOKEN = "xoxb-482019375610-5830917264019-Qm7Rk2Lp9Xv4Tz8Nw3Bc6Hd1"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJvcHMtYm90Iiwicm9sZSI6ImFkbWluIiwiaWF0IjoxNzAwMDAwMDAwfQ"
    ".kQ9vR3mT7xLp2Wn8Zc4Yb6Hd1Fg5Js0Ae3Ui9Ok7Lq2"
)
DB_PASSWORD = "S3cr3t-Passw0rd-9x"
ASSIGNED = "Sup3rS3cretValue99!"
ODBC_PWD = "Xy7pq2Lm9w"
YAML_KEY = "k3y-" + "4f7b9c2e81d0"
DB_URL = f"{PG}://app_user:{DB_PASSWORD}@db-primary.internal:5432/orders"
PEM_BODY = [
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK",
    "LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo",
]
PEM = "-----BEGIN RSA " + "PRIVATE KEY-----\n" + "\n".join(PEM_BODY) + "\n-----END RSA PRIVATE KEY-----"
GCP_KEY_ID = "3f9c2a7b1e8d4c6f0a5b9e2d7c1f4a8b6e3d0c95"
GCP_PEM = "-----BEGIN " + "PRIVATE KEY-----\n" + "\n".join(PEM_BODY[::-1]) + "\n-----END PRIVATE KEY-----"
GCP_JSON = json.dumps(
    {
        "type": "service_account",
        "project_id": "ops-prod-417",
        "private_key_id": GCP_KEY_ID,
        "private_key": GCP_PEM + "\n",
        "client_email": "diag@ops-prod-417.iam.gserviceaccount.com",
    },
    indent=2,
)

# (label, pasted text, originals that must disappear, a kind whose placeholder must appear)
CORPUS = [
    (
        "aws",
        f"aws_access_key_id = {AWS_KEY_ID}\naws_secret_access_key = {AWS_SECRET}",
        [AWS_KEY_ID, AWS_SECRET],
        "aws-access-key",
    ),
    ("gcp", GCP_JSON, [GCP_KEY_ID, *PEM_BODY], "private-key"),
    (
        "github",
        f"git clone https://x-access-token:{GITHUB_TOKEN}@github.com/acme/ops.git fails",
        [GITHUB_TOKEN],
        "url-password",
    ),
    ("github-bare", f"export GITHUB_TOKEN={GITHUB_TOKEN}", [GITHUB_TOKEN], "github-token"),
    ("slack", f"webhook posted with token {SLACK_TOKEN} returned 403", [SLACK_TOKEN], "slack-token"),
    ("jwt", f"curl -H 'Authorization: Bearer {JWT}' https://api.internal/v1/orders -> 401", [JWT], "jwt"),
    ("pem", f"nginx: cannot load key\n{PEM}\n", PEM_BODY, "private-key"),
    ("db-url", f"django.db.utils.OperationalError connecting to {DB_URL}", [DB_PASSWORD], "url-password"),
    # Unquoted assignments, as pasted from env files, DSNs and command lines (detect-secrets' keyword
    # detector needs quotes outside config files).
    (
        "env-assignment",
        f"login fails with DB_PASSWORD={ASSIGNED} since the deploy",
        [ASSIGNED],
        "secret-keyword",
    ),
    ("odbc-dsn", f"Driver={{MySQL}};Server=db-1;Uid=app;Pwd={ODBC_PWD};", [ODBC_PWD], "secret-keyword"),
    ("yaml-colon", f"api_key: {YAML_KEY}", [YAML_KEY], "secret-keyword"),
]

ALL_ORIGINALS = sorted({o for _l, _t, originals, _k in CORPUS for o in originals})


def pasted_all() -> str:
    """Every corpus entry in one pasted block (a question, a tool output, an alert)."""
    return "\n\n".join(text for _l, text, _o, _k in CORPUS)
