"""Prometheus metrics from SQL, at a cost that follows the active work, not the history.

Workers, beat and the API are separate processes (and a worker has several children), so
in-process counters would each see a slice. The tables are the one shared record, and any
API replica answers the same numbers. Two kinds of figures come out of them:

- the current state (unfinished jobs by state, nets by state, the oldest queued job, stray
  runs) is read from the tables at scrape time: those rows are the active work, found by
  index;
- everything the history says (finished jobs, the three histograms, scale events, server
  uptime, retries, requeues, report timeouts) is kept as running totals (`metric_totals`,
  and one `metric_net_clocks` row per net). Every scrape first folds in the history written
  since the previous one: a history row not yet counted has `counted = false` (a partial
  index finds those), and is marked counted in the same transaction that adds it to the
  totals. So each row is counted exactly once, whatever commits late, whichever replica
  scrapes and however a scrape ends, and a scrape costs the rows written since the last one.
  Jobs' `retries` (a number updated in place) are folded the same way through
  `retries_counted`.

The figures mean exactly what a full scan of the tables would say (tests/metrics_reference.py
is that scan; a test and the scrape benchmark compare the two). Pruning history no longer
lowers a counter. `catch_up` folds a long backlog in batches (`fl-dispatcher db upgrade` runs
it, so the first scrape after the upgrade that added the totals is not the one to pay).

The modules: `figures` (what a scrape reports, and the pure computations over history rows),
`fold` (new history into the running totals), `read` (a scrape's Snapshot) and `exposition`
(the Prometheus families and the collector).
"""
