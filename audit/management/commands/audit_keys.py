"""`manage.py audit_keys`: the public keys checkpoints are signed and verified with (never a private key)."""

from django.conf import settings
from django.core.management.base import BaseCommand

from audit.transparency import keys, note


class Command(BaseCommand):
    help = (
        "Print the signed-note key id (8 hex, as checkpoints name it) and public key (base64 of its 32 raw "
        "bytes) of every signing key, newest first "
        "(the first signs), and of every retired key in AUDIT_VERIFY_KEYS, each with its C2SP signed-note "
        "vkey under AUDIT_LOG_ORIGIN (what witnesses and note verifiers are configured with). Give either "
        "to `python -m audit.verify_bundle --public-key`."
    )

    def handle(self, *args, **options):
        signing = keys.signing_keys()
        for position, key in enumerate(signing):
            role = "signing" if position == 0 else "verifying (older signing key)"
            self.stdout.write(f"{key.key_id} {key.public_text} {role} vkey={_vkey(key.public)}")
        own = {k.key_id for k in signing}
        for key_id, public in keys.verification_keys().items():
            if key_id not in own:
                self.stdout.write(
                    f"{key_id} {note.public_text(public)} verifying (retired) vkey={_vkey(public)}"
                )


def _vkey(public) -> str:
    return note.log_vkey(settings.AUDIT_LOG_ORIGIN, public)
