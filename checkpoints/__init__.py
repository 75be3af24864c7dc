"""Everything durable, in one database per deployment (SQLite by default, or Postgres).

* `database`: which database (URL resolution) and how to connect to it.
* `sql`: the small dialect layer that lets each statement be written once for both backends.
* `factory`: LangGraph checkpointers by URL (sync, fenceable; async for the LangGraph server).
* `journal`: the action journal, one row per business intent, moved by compare-and-set.
* `leases`: run leases with fencing tokens, so that a run has one writer.
* `fenced`: checkpointers that refuse a stale worker's write in the transaction that writes
  (and those of LangGraph's own layout, for the server's runs).
* `compact`: the runtime's checkpointer, a row per checkpoint (`frames`: the row format;
  `delta_history`: a DeltaChannel's history read from the rows).
* `schema`, `retention`: loopwright's tables and their migrations, and the job that prunes
  finished runs.
"""
