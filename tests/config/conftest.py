"""Fixtures of the deployment tests: the scripted provider, the running deployment, the runbooks."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from tests.config.support import Deployment, require_deployment_services
from tests.fakes.openai_server import serving
from tests.surfaces.chat.support import ScriptedProvider


@pytest.fixture
def provider():
    with serving(ScriptedProvider()) as scripted:
        yield scripted


@pytest.fixture
def deployment(tmp_path, provider, knowledge):
    require_deployment_services()
    deployed = Deployment(tmp_path, provider)
    try:
        for daphne in deployed.daphnes:
            daphne.start()
        deployed.nginx.start(deployed.tls_port)
        yield deployed
    finally:
        deployed.stop()


@pytest.fixture
def knowledge(db):
    call_command("load_knowledge", "runbooks", stdout=StringIO())
