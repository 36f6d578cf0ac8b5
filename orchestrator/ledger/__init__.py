"""The ledger: every instance, event, run and job, in SQLite or PostgreSQL (``ledger``: the models
and the ``Ledger``), read with plain SQL where the models cost too much (``ledger_sql``), read whole
for what looks at the fleet (``ledger_snapshot``), and which orch process works on an instance
(``claims``).

Layer 6 (ARCHITECTURE.md): imports the words, SSH and what a provider is; never the lifecycle, the
fleet or the jobs. This ``__init__`` imports nothing, so ``ledger_sql`` stays light for the CLI's
quick paths."""
