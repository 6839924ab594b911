"""Test-only models for the generic framework pieces (tables created by conftest)."""

from __future__ import annotations

from django.db import models

from queueing.ledger import LedgerEntry


class Step(LedgerEntry):
    unit = models.CharField(max_length=50)
    stage = models.CharField(max_length=50)

    class Meta:
        app_label = "queueing"
        db_table = "test_steps"
        constraints = [models.UniqueConstraint(fields=["unit", "stage"], name="test_steps_uq")]


class Child(models.Model):
    unit = models.CharField(max_length=50)
    index = models.IntegerField()
    value = models.CharField(max_length=50)

    class Meta:
        app_label = "queueing"
        db_table = "test_children"
        constraints = [models.UniqueConstraint(fields=["unit", "index"], name="test_children_uq")]


class Blob(models.Model):
    sha = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=200)
    size = models.IntegerField(default=0)

    class Meta:
        app_label = "queueing"
        db_table = "test_blobs"
        constraints = [models.UniqueConstraint(fields=["sha", "storage_key"], name="test_blobs_uq")]


class Item(models.Model):
    owner = models.CharField(max_length=50)
    status = models.CharField(max_length=20)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    label = models.CharField(max_length=50, default="")

    class Meta:
        app_label = "queueing"
        db_table = "test_items"


class Swept(models.Model):
    state = models.CharField(max_length=20, default="new")
    touched_at = models.DateTimeField()
    boom = models.BooleanField(default=False)

    class Meta:
        app_label = "queueing"
        db_table = "test_swept"


MODELS = [Step, Child, Blob, Item, Swept]
