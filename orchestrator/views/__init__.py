"""What orch shows: instances and runs (``instances``: the ``--json`` dicts, plain columns, the
fast read of ``orch status``), the fleet table (``fleet``), and jobs (``jobs``). Views read;
they never write the ledger."""
