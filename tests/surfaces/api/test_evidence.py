"""The transparency log's endpoints: a run's evidence bundle, the checkpoint list with public keys, and
consistency proofs — who may call them (401 → 400 → 404 → 403), their bodies, and their errors in the
contract's shape."""

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from audit.transparency import bundle, keys, log, merkle, note, signednote
from tests.factories import REASONING_MARKER, issue_token, make_recorded_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def signing_key(settings):
    text = keys.generate_key_text()
    settings.AUDIT_SIGNING_KEYS = [text]
    settings.AUDIT_VERIFY_KEYS = []
    return text


@pytest.fixture
def users(user, other_user, staff_user, auditor, superuser):
    return {
        "owner": user,
        "other": other_user,
        "staff": staff_user,
        "auditor": auditor,
        "superuser": superuser,
    }


def _client(user=None):
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user)}")
    return client


@pytest.fixture
def anchored(user, signing_key):
    runs = [make_recorded_run(user) for _ in range(3)]
    # Checkpoints of sizes 2 and 4: the last run, then the governance chain (migrate's grants).
    assert [cp.tree_size for cp in log.checkpoint(batch_size=2).checkpoints] == [2, 4]
    return runs


def _evidence_url(run):
    return f"/api/diagnosis/{run.session_id}/runs/{run.run_id}/evidence"


@pytest.mark.parametrize(
    ("role", "status"),
    [
        ("anonymous", 401),
        ("owner", 403),
        ("other", 404),
        ("staff", 200),
        ("auditor", 200),
        ("superuser", 200),
    ],
)
def test_evidence_access(role, status, users, anchored):
    run = anchored[1]
    response = _client(users.get(role)).get(_evidence_url(run))
    assert response.status_code == status, response.content
    if status != 200:
        assert set(response.json()["error"]) == {"code", "message"}
        return
    body = response.json()
    assert REASONING_MARKER not in response.content.decode()
    report = bundle.verify(body, [keys.current_key().public])
    assert report.ok, report.failures
    # 3 runs, and the governance chain's head (the staff, auditor and superuser users were created
    # with their rights before the checkpoint): the newest checkpoint covers 4 leaves.
    assert body["anchor"]["treeSize"] == 4 and body["anchor"]["leafIndex"] == 1


def test_evidence_of_another_sessions_run_is_404_and_a_non_staff_auditor_sees_only_own(
    anchored, staff_user, django_user_model
):
    first, second = anchored[0], anchored[1]
    crossed = f"/api/diagnosis/{first.session_id}/runs/{second.run_id}/evidence"
    assert _client(staff_user).get(crossed).status_code == 404
    assert (
        _client(staff_user).get(f"/api/diagnosis/{first.session_id}/runs/run_absent/evidence").status_code
        == 404
    )
    outsider = django_user_model.objects.create_user("lone-auditor", password="pw-lone-1")
    outsider.groups.add(Group.objects.get(name="Reasoning Auditors"))
    assert _client(outsider).get(_evidence_url(first)).status_code == 404  # not their session
    own = make_recorded_run(outsider)
    assert _client(outsider).get(_evidence_url(own)).status_code == 200  # not anchored yet: anchor null
    assert _client(outsider).get(_evidence_url(own)).json()["anchor"] is None


def test_the_checkpoint_list_is_newest_first_with_the_public_keys(anchored, users):
    assert _client().get("/api/audit/checkpoints/").status_code == 401
    denied = _client(users["owner"]).get("/api/audit/checkpoints/")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "permission_denied"
    body = _client(users["auditor"]).get("/api/audit/checkpoints/").json()
    assert body["count"] == 2 and [c["treeSize"] for c in body["results"]] == [4, 2]
    newest = body["results"][0]
    assert newest["previousHash"] == body["results"][1]["checkpointHash"]
    [key] = body["publicKeys"]
    current = keys.current_key()
    assert key == {
        "keyId": current.key_id,
        "vkey": current.vkey,
        "algorithm": "Ed25519",
        "publicKey": current.public_text,
        "signing": True,
        "legacyKeyId": note.key_id(current.public),
    }
    # One key id everywhere (issue 50): the checkpoints' and the keys' are the signed-note key id, and the
    # published vkey (what a witness is configured with) names it and verifies the checkpoint.
    assert len(key["keyId"]) == 8 and newest["keyId"] == key["keyId"] and f"+{key['keyId']}+" in key["vkey"]
    parsed = note.parse_note_body(newest["body"], newest["link"])
    note.verify_checkpoint(
        newest["body"],
        parsed,
        newest["signature"],
        note.load_public(key["publicKey"]),
        newest["linkSignature"],
    )
    verifier = signednote.parse_vkey(key["vkey"])
    text = note.signed_note(newest["body"], parsed.origin, newest["signature"])
    assert signednote.verify_note(text, [verifier]) == (newest["body"], [verifier])


def test_a_consistency_proof_between_checkpoints(anchored, users):
    client = _client(users["staff"])
    body = client.get("/api/audit/checkpoints/4/consistency?from=2").json()
    assert (body["fromTreeSize"], body["treeSize"]) == (2, 4)
    assert body["fromCheckpoint"] is not None and body["checkpoint"]["body"]
    merkle.verify_consistency(
        2,
        4,
        bytes.fromhex(body["fromRootHash"]),
        bytes.fromhex(body["rootHash"]),
        [bytes.fromhex(h) for h in body["proof"]],
    )
    older = note.parse_any(body["fromCheckpoint"]["body"])
    assert older.root_hash == body["fromRootHash"]
    # Both checkpoints as signed notes (issue 50), each verifying with the published vkey, and their
    # links naming them.
    verifier = signednote.parse_vkey(keys.current_key().vkey)
    for side in (body["checkpoint"], body["fromCheckpoint"]):
        assert signednote.verify_note(side["note"], [verifier])[0] == side["body"]
        link, _ = signednote.verify_note(side["link"], [verifier])
        assert note.parse_note_body(side["body"], link).tree_size in (2, 4)
    one = client.get("/api/audit/checkpoints/4/consistency?from=1").json()
    assert one["fromCheckpoint"] is None and len(one["proof"]) >= 1


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/api/audit/checkpoints/4/consistency", 400),
        ("/api/audit/checkpoints/4/consistency?from=0", 400),
        ("/api/audit/checkpoints/4/consistency?from=x", 400),
        ("/api/audit/checkpoints/4/consistency?from=5", 400),
        ("/api/audit/checkpoints/1/consistency?from=1", 404),
        ("/api/audit/checkpoints/abc/consistency?from=1", 404),
    ],
)
def test_consistency_errors_are_in_the_error_shape(url, status, anchored, users):
    response = _client(users["staff"]).get(url)
    assert response.status_code == status
    assert set(response.json()["error"]) >= {"code", "message"}
    assert _client(users["owner"]).get(url).status_code in (403, 404)
