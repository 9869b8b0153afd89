"""OpenAPI: `ApiTokenAuthentication` is documented as the same `tokenAuth` scheme DRF's token had
(`Authorization: Token <token>`), so the schema's security section is unchanged."""

from drf_spectacular.authentication import TokenScheme


class ApiTokenScheme(TokenScheme):
    target_class = "access.authentication.ApiTokenAuthentication"
    name = "tokenAuth"
