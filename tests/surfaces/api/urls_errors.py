"""URL map for tests/surfaces/api/test_errors.py: the real URL map plus views that fail on purpose, each
failure carrying the reasoning marker in its message (it must reach neither the response nor the logs)."""

from django.db import connection
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from config.urls import urlpatterns as real_urlpatterns
from tests.factories import REASONING_MARKER


class FailingApi(APIView):
    def get(self, request):
        raise RuntimeError(f"leaked reasoning: {REASONING_MARKER}")


class FailingSqlApi(APIView):
    def get(self, request):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT no_such_column FROM no_such_table WHERE x = '{REASONING_MARKER}'")
        return Response({})


def failing_plain_view(request):
    raise ValueError(f"plain view failed: {REASONING_MARKER}")


async def failing_async_view(request):
    raise ValueError(f"async view failed: {REASONING_MARKER}")


urlpatterns = [
    *real_urlpatterns,
    path("api/test-errors/drf", FailingApi.as_view()),
    path("api/test-errors/sql", FailingSqlApi.as_view()),
    path("api/test-errors/plain", failing_plain_view),
    path("api/test-errors/async", failing_async_view),
    path("elsewhere/plain", failing_plain_view),
]

handler404 = "core.api.handler404"
handler500 = "core.api.handler500"
