"""System checks of the diagnosis runtime's configuration.

`diagnosis.E001` (an error: `runserver`, `migrate` and `check --deploy` refuse to start): `CHAT_RELEASE`
is neither `verified` nor `draft`. A typo must not silently pick a release policy.
`diagnosis.E002` (an error): an entry of `TRUSTED_PROXIES` is not an address or CIDR network
(`core.proxy`); a typo must not silently trust nobody, or somebody else.
"""

from django.conf import settings
from django.core.checks import Error, register

from diagnosis.models import ReleaseMode


@register()
def check_release_mode(app_configs=None, **kwargs) -> list[Error]:
    value = str(getattr(settings, "CHAT_RELEASE", ReleaseMode.VERIFIED)).strip().lower()
    if value in ReleaseMode.values:
        return []
    return [
        Error(
            f"CHAT_RELEASE={value!r} is not a release policy.",
            hint="Use `verified` (default: no answer text before the guards decide) or `draft` "
            "(unverified drafts are streamed and recorded as delivered).",
            id="diagnosis.E001",
        )
    ]


@register()
def check_trusted_proxies(app_configs=None, **kwargs) -> list[Error]:
    import ipaddress

    bad = []
    for item in getattr(settings, "TRUSTED_PROXIES", ()) or ():
        try:
            ipaddress.ip_network(str(item).strip(), strict=False)
        except ValueError:
            bad.append(str(item))
    if not bad:
        return []
    return [
        Error(
            f"TRUSTED_PROXIES has entries that are not addresses or networks: {', '.join(map(repr, bad))}.",
            hint="Use comma-separated CIDRs or addresses of the reverse proxies, e.g. 127.0.0.1/32,10.0.0.5.",
            id="diagnosis.E002",
        )
    ]
