"""What things cost: the policy (stop or destroy, break-even: ``policy``), the list prices orch
ships (``catalogue``), what the ledger says was spent (``cost``), every provider's offers ranked by
cost per job (``offers``) and the budget over everything (``budget``).

Layers 2, 9 and 11 (ARCHITECTURE.md): ``policy`` and ``catalogue`` are words; ``cost`` reads the
ledger (one instance's layer); ``offers`` and ``budget`` look at the whole fleet. Each imports only
from its own layer and below."""
