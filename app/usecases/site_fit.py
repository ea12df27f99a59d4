"""SQL: a job's required sites are all among a net's declared sites, asked in the statement
that reads the queue, so a claim takes the first job of its order that fits the net however
many jobs before it need a site the net lacks, and the idle check counts the same jobs (one
looked through the net's next 50 only, the other through all: a job behind 50 that did not
fit kept an idle server up that the claim never gave it). SQL only.

The net's sites are one bind parameter, their JSON text (`net_sites_param`): PostgreSQL asks
jsonb containment, SQLite looks for a required site outside them with `json_each`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, String, bindparam
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

NET_SITES = "net_sites"


class SitesWithin(ColumnElement[bool]):
    """SQL: every element of the JSON list `required` is in the JSON list `sites`."""

    inherit_cache = True
    type = Boolean()
    _traverse_internals = [
        ("required", InternalTraversal.dp_clauseelement),
        ("sites", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, required: Any, sites: Any) -> None:
        self.required = required
        self.sites = sites


@compiles(SitesWithin)
def _json_each(element: SitesWithin, compiler: SQLCompiler, **kw: Any) -> str:
    required = compiler.process(element.required, **kw)
    sites = compiler.process(element.sites, **kw)
    # Both are compiled SQL (a column, a bind parameter's placeholder): no value is pasted.
    return (
        f"NOT EXISTS (SELECT 1 FROM json_each({required}) AS required_site"  # noqa: S608
        f" WHERE required_site.value NOT IN (SELECT net_site.value FROM json_each({sites})"
        " AS net_site))"
    )


@compiles(SitesWithin, "postgresql")
def _contained(element: SitesWithin, compiler: SQLCompiler, **kw: Any) -> str:
    required = compiler.process(element.required, **kw)
    sites = compiler.process(element.sites, **kw)
    return f"(CAST({required} AS jsonb) <@ CAST({sites} AS jsonb))"


def sites_within(required: Any) -> SitesWithin:
    """SQL: the JSON list column `required` names only sites of the net whose sites the
    statement's `net_sites` parameter holds (`net_sites_param`)."""
    return SitesWithin(required, bindparam(NET_SITES, type_=String))


def net_sites_param(sites: Sequence[str]) -> dict[str, str]:
    """The `net_sites` parameter for a net that declares `sites`."""
    return {NET_SITES: json.dumps(list(sites))}
