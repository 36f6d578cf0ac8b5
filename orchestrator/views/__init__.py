"""What orch shows: instances and runs (``instances``: the ``--json`` dicts, plain columns, the
fast read of ``orch status``), the fleet table (``fleet``), jobs (``jobs``) and the dashboard
(``dashboard``). Views read; they never write the ledger.

Layers 11 and 13 (ARCHITECTURE.md): what shows instances and the fleet sits with the fleet; what
shows jobs sits above them."""
