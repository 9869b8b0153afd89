"""OpenAPI: `ApiTokenAuthentication` is documented as the same `tokenAuth` scheme DRF's token had
(`Authorization: Token <token>`), so the schema's security section is unchanged."""

from drf_spectacular.authentication import TokenScheme


class ApiTokenScheme(TokenScheme):
    target_class = "surfaces.api.authentication.ApiTokenAuthentication"
    name = "tokenAuth"


LOCKED_OUT_DESCRIPTION = (
    "Too many requests (`throttled`), or too many failed authentications counted against this caller "
    "(`locked_out`, access.lockout: this user from this address, or this address's anonymous guesses); "
    "see `Retry-After` for the seconds left."
)


def add_locked_out(result, generator, request, public):
    """`SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]`: every operation that takes an API token can answer
    429 `locked_out` (the authentication itself refuses a locked-out counter), so each documents
    a 429 in the error shape. Runs after the chat paths are added."""
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            schemes = {name for requirement in operation.get("security", ()) for name in requirement}
            if "tokenAuth" not in schemes:
                continue
            responses = operation.setdefault("responses", {})
            if "429" not in responses:
                responses["429"] = {
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                    "description": LOCKED_OUT_DESCRIPTION,
                }
    return result
