"""Column types and indexes the tables share (models.tables): the history rows' ids, a state
stored as a short checked string, and the index of the history rows metrics has not counted.

They run while their modules are imported, before mutmut can switch a mutant in, so their
mutants always survive; what they build is the schema, which the unit tier checks against the
migrations (`db check` in test_cli.py)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Enum, Index, Integer, text

from models.states import ACTIVE_JOB_STATES, JobState, NetState

# SQLite only auto-increments an INTEGER PRIMARY KEY.
EVENT_ID = BigInteger().with_variant(Integer(), "sqlite")

# The job states that hold a net, as SQL (partial indexes' predicates).
ACTIVE_SQL = "state IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(ACTIVE_JOB_STATES)))


# Runs at import, before mutmut could switch a mutant in (nor is this file in only_mutate).
def state_enum(enum: type[JobState] | type[NetState], name: str) -> Enum:  # pragma: no mutate block
    """A state column's type: stored by value as a short string with a CHECK, not a native
    PG enum, so adding a state later is a plain migration on both dialects."""
    return Enum(
        enum,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda e: [m.value for m in e],
        validate_strings=True,
    )


# Runs at import, before mutmut could switch a mutant in (nor is this file in only_mutate).
def uncounted_index(table: str) -> Index:  # pragma: no mutate block
    """The history rows app.metrics has not folded into its running totals yet: few at any
    time (those written since the last scrape), found without reading the history."""
    return Index(
        f"ix_{table}_uncounted",
        "id",
        postgresql_where=text("NOT counted"),
        sqlite_where=text("counted = 0"),
    )
