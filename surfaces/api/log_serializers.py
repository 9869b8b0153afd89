"""Output shapes of the transparency log's endpoints: checkpoints (one, a page of them with the public
keys), consistency proofs between two tree sizes, and a run's evidence bundle.

The views return the dicts `audit.transparency.store`, `keys` and `evidence` build; these serializers
describe them in the OpenAPI schema (and, where a view renders through one, rename model attributes to
the contract's camelCase keys). The bundle's shape is what `audit.transparency.bundle` verifies offline.
"""

from __future__ import annotations

from rest_framework import serializers


class SignedNoteSerializer(serializers.Serializer):
    body = serializers.CharField(
        help_text="The exact signed text: a C2SP tlog-checkpoint body (canonical JSON of the checkpoint's "
        "fields for checkpoints signed before issue 35)."
    )
    signature = serializers.CharField(
        help_text="Base64 of the signed-note signature (4-byte key id, Ed25519 signature of the body; the "
        "line is '— <origin> <signature>'), or, for a JSON body, base64 of its Ed25519 signature."
    )
    note = serializers.CharField(
        allow_null=True,
        help_text="The checkpoint as a C2SP signed note (body, blank line, the log's signature line, the "
        "witnesses' cosignature lines): what a witness or note verifier reads. Null for a JSON body.",
    )
    link = serializers.CharField(
        allow_null=True,
        help_text="A plain checkpoint's link as a signed note by the same key: its body's hash, signing "
        "time and predecessor. Null for older checkpoints (they carry both in their body).",
    )

    class Meta:
        ref_name = "SignedCheckpoint"


class CheckpointSerializer(serializers.Serializer):
    treeSize = serializers.IntegerField(source="tree_size")
    rootHash = serializers.CharField(
        source="root_hash", help_text="Hex RFC 9162 MTH of the first treeSize leaves."
    )
    signedAt = serializers.DateTimeField(source="signed_at")
    previousHash = serializers.CharField(
        source="previous_hash", help_text="The previous checkpoint's checkpointHash; empty for the first."
    )
    keyId = serializers.CharField(
        source="key_id",
        help_text="The signing key's signed-note key id (8 hex; 16 hex for JSON checkpoints of before "
        "issue 35).",
    )
    checkpointHash = serializers.CharField(
        source="checkpoint_hash",
        help_text="Hex SHA-256 of the link (plain checkpoints, since issue 50), else of the body.",
    )
    body = serializers.CharField()
    signature = serializers.CharField()
    link = serializers.CharField(
        help_text="A plain checkpoint's link text (body hash, signing time, predecessor); empty for older "
        "checkpoints."
    )
    linkSignature = serializers.CharField(
        source="link_signature", help_text="Base64 signed-note signature of the link by the same key."
    )

    class Meta:
        ref_name = "Checkpoint"


class PublicKeySerializer(serializers.Serializer):
    keyId = serializers.CharField(
        help_text="The C2SP signed-note key id under the log's origin (8 hex digits): the id checkpoints' "
        "signature lines and `keyId` name."
    )
    vkey = serializers.CharField(
        help_text="The signed-note verifier key `<origin>+<key id>+<base64(0x01 || key)>`: what witnesses "
        "and note verifiers are configured with (give it to verify_bundle)."
    )
    algorithm = serializers.ChoiceField(choices=["Ed25519"])
    publicKey = serializers.CharField(help_text="Base64 of the 32 raw bytes (give it to verify_bundle).")
    signing = serializers.BooleanField(help_text="True for the key that signs new checkpoints.")
    legacyKeyId = serializers.CharField(
        help_text="Legacy: the 16-hex id (SHA-256 of the raw key) the JSON checkpoints signed before issue "
        "35 name."
    )

    class Meta:
        ref_name = "PublicKey"


class CheckpointPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = CheckpointSerializer(many=True)
    publicKeys = PublicKeySerializer(many=True)

    class Meta:
        ref_name = "CheckpointPage"


class ConsistencyQuerySerializer(serializers.Serializer):
    """`?from=M` (a Python keyword, hence `get_fields`)."""

    def get_fields(self):
        return {"from": serializers.IntegerField(min_value=1)}


class ConsistencySerializer(serializers.Serializer):
    fromTreeSize = serializers.IntegerField()
    treeSize = serializers.IntegerField()
    fromRootHash = serializers.CharField(help_text="The stored root of the older size (compare with yours).")
    rootHash = serializers.CharField()
    proof = serializers.ListField(
        child=serializers.CharField(), help_text="Hex hashes, RFC 9162 PROOF(m, D[n])."
    )
    checkpoint = SignedNoteSerializer()
    fromCheckpoint = SignedNoteSerializer(
        allow_null=True, help_text="Set when a checkpoint of that size exists."
    )

    class Meta:
        ref_name = "ConsistencyProof"


class EvidenceEventSerializer(serializers.Serializer):
    runId = serializers.CharField()
    sessionId = serializers.CharField()
    sequenceNo = serializers.IntegerField()
    phase = serializers.CharField()
    eventType = serializers.CharField()
    status = serializers.CharField()
    summary = serializers.CharField()
    details = serializers.JSONField()
    createdAt = serializers.CharField(help_text="As hashed: UTC, microseconds.")
    prevHash = serializers.CharField()
    hash = serializers.CharField()

    class Meta:
        ref_name = "EvidenceEvent"


class EvidenceRowSerializer(serializers.Serializer):
    digest = serializers.CharField(help_text="Hex SHA-256 of the canonical JSON of `form`.")
    form = serializers.JSONField(help_text='{"form": "step" | "tool" | "run", "row": {column: value}}.')

    class Meta:
        ref_name = "EvidenceRow"


class EvidenceReasoningSerializer(serializers.Serializer):
    stepIndex = serializers.IntegerField()
    agentName = serializers.CharField()
    digest = serializers.CharField(help_text="The reasoning row's digest only: never its content.")

    class Meta:
        ref_name = "EvidenceReasoning"


class EvidenceRowsSerializer(serializers.Serializer):
    steps = EvidenceRowSerializer(many=True)
    tools = EvidenceRowSerializer(many=True)
    reasoning = EvidenceReasoningSerializer(many=True)
    run = EvidenceRowSerializer(allow_null=True, help_text="The terminal summary (content as its SHA-256).")
    reviews = EvidenceRowSerializer(
        many=True, required=False, help_text="The run's review rows (form `review`); absent in older bundles."
    )

    class Meta:
        ref_name = "EvidenceRows"


class EvidenceCheckpointSerializer(serializers.Serializer):
    """The anchor's checkpoint: `note` and `link` (plain checkpoints, since issue 50), `note` alone
    (checkpoints with extension lines, issues 35 to 49), or `body` and `signature` (the JSON checkpoints
    signed before)."""

    note = serializers.CharField(
        required=False,
        help_text="The checkpoint as a C2SP signed note: its tlog-checkpoint body, a blank line, the log's "
        "signature line and the stored witness cosignature/v1 lines.",
    )
    link = serializers.CharField(
        required=False,
        help_text="A plain checkpoint's link as a C2SP signed note by the same key (its body's hash, signing "
        "time and predecessor); absent for checkpoints with extension lines (signed before issue 50).",
    )
    body = serializers.CharField(required=False, help_text="A JSON checkpoint's signed body (older ones).")
    signature = serializers.CharField(required=False, help_text="A JSON checkpoint's base64 signature.")

    class Meta:
        ref_name = "EvidenceCheckpoint"


class EvidenceAnchorSerializer(serializers.Serializer):
    leafIndex = serializers.IntegerField()
    leafData = serializers.CharField(help_text="The canonical JSON the leaf hash commits to.")
    leafHash = serializers.CharField()
    treeSize = serializers.IntegerField()
    inclusionProof = serializers.ListField(child=serializers.CharField(), help_text="Hex, RFC 9162 PATH.")
    checkpoint = EvidenceCheckpointSerializer()

    class Meta:
        ref_name = "EvidenceAnchor"


class EvidenceBundleSerializer(serializers.Serializer):
    format = serializers.ChoiceField(choices=["diagnosis-audit-evidence/v1"])
    runId = serializers.CharField()
    sessionId = serializers.CharField()
    events = EvidenceEventSerializer(many=True)
    rows = EvidenceRowsSerializer()
    anchor = EvidenceAnchorSerializer(allow_null=True, help_text="Null until a checkpoint covers the run.")

    class Meta:
        ref_name = "EvidenceBundle"
