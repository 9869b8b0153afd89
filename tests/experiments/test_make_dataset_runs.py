"""`manage.py make_dataset NAME --run A B C` (issue 50, item 4): several run ids after one `--run`, as
well as `--run A --run B`; the dataset holds them in the order given."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from experiments.models import Dataset
from tests.factories import make_recorded_run

pytestmark = pytest.mark.django_db


def test_make_dataset_takes_several_run_ids_after_one_run_option(user):
    a, b, c = (make_recorded_run(user, query=f"Why is disk {n} full?") for n in "abc")
    out = io.StringIO()
    call_command("make_dataset", "picked", "--run", a.run_id, b.run_id, c.run_id, stdout=out)
    assert "picked v1: 3 items" in out.getvalue()
    items = Dataset.objects.get(name="picked", version=1).items.order_by("position")
    assert list(items.values_list("source_run_id", flat=True)) == [a.run_id, b.run_id, c.run_id]

    call_command("make_dataset", "repeated", "--run", c.run_id, "--run", a.run_id, stdout=out)
    repeated = Dataset.objects.get(name="repeated", version=1).items.order_by("position")
    assert list(repeated.values_list("source_run_id", flat=True)) == [c.run_id, a.run_id]
