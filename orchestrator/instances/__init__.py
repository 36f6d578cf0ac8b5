"""Instances and groups of them: what everything below the lifecycle may call on an ``Orch``
(``instance_ops``: provider, move, connect, down), the controller's side of the watchdog
(``watchdog``), what a provider shows brought into the ledger (``sync``) and what a failed create
left settled (``reconcile``), the lifecycle's ``Orch`` (``lifecycle``: up, stop, start), and N nodes
of one offer brought up, ended and mended together (``groups``).

Layers 8 to 11 (ARCHITECTURE.md); each imports only from its own layer and below, so ``reconcile``
never calls back into the lifecycle that called it."""
