from __future__ import annotations

import pytest
from django.db import connection

from queueing.exceptions import RowVanished
from queueing.rows import insert_or_get, replace_children
from tests.conftest import run_concurrently
from tests.queueing.models import Blob, Child


@pytest.mark.django_db
def test_replace_children_on_retry_does_not_trip_the_unique_key():
    rows = [Child(index=i, value=f"v{i}") for i in range(3)]
    replace_children(Child, parent={"unit": "a"}, rows=rows)
    # The retry writes the same indexes again: DELETE-before-INSERT keeps one set.
    replace_children(
        Child, parent={"unit": "a"}, rows=[Child(index=i, value="w") for i in range(2)]
    )
    assert list(Child.objects.filter(unit="a").values_list("index", "value")) == [
        (0, "w"),
        (1, "w"),
    ]


@pytest.mark.django_db
def test_replace_children_failure_keeps_the_old_rows():
    replace_children(Child, parent={"unit": "b"}, rows=[Child(index=0, value="old")])
    duplicate = [Child(index=1, value="x"), Child(index=1, value="y")]
    with pytest.raises(Exception, match=r"test_children_uq|duplicate"):
        replace_children(Child, parent={"unit": "b"}, rows=duplicate)
    assert list(Child.objects.filter(unit="b").values_list("value", flat=True)) == ["old"]


@pytest.mark.django_db
def test_replace_children_leaves_other_parents_alone():
    replace_children(Child, parent={"unit": "c"}, rows=[Child(index=0, value="c")])
    replace_children(Child, parent={"unit": "d"}, rows=[])
    assert Child.objects.filter(unit="c").count() == 1


@pytest.mark.django_db
def test_insert_or_get_returns_the_id_in_the_table():
    first = insert_or_get(
        Blob,
        values={"sha": "s1", "storage_key": "k", "size": 3},
        conflict_fields=("sha", "storage_key"),
    )
    again = insert_or_get(
        Blob,
        values={"sha": "s1", "storage_key": "k", "size": 3},
        conflict_fields=("sha", "storage_key"),
    )
    assert first[1] is True and again == (first[0], False)
    assert Blob.objects.get().pk == first[0]


@pytest.mark.django_db(transaction=True)
def test_insert_or_get_under_concurrency_names_one_row():
    results = run_concurrently(
        lambda i: insert_or_get(
            Blob, values={"sha": "s2", "storage_key": "k"}, conflict_fields=("sha", "storage_key")
        ),
        12,
    )
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len({r[0] for r in results}) == 1
    assert sum(r[1] for r in results) == 1
    assert Blob.objects.filter(sha="s2").count() == 1


@pytest.mark.django_db
def test_insert_or_get_raises_when_the_conflicting_row_vanished(monkeypatch):
    Blob.objects.create(sha="s3", storage_key="k")
    manager = Blob._default_manager
    original_using = manager.using

    def delete_then_use(alias):
        # A concurrent delete lands between the INSERT's conflict and the lookup.
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM test_blobs WHERE sha = 's3'")
        return original_using(alias)

    monkeypatch.setattr(manager, "using", delete_then_use)
    with pytest.raises(RowVanished, match="conflicted but cannot be found"):
        insert_or_get(
            Blob, values={"sha": "s3", "storage_key": "k"}, conflict_fields=("sha", "storage_key")
        )
