"""Volumes: what a task asks to mount (``volume_uses``), the ledger's table of volumes
(``ledger_volumes``, read whole by ``volume_snapshot``), each node's mounts placed and made ready
(``volume_mounts``), and a volume as money: made, listed, costed, deleted only on request
(``volumes``).

Layers 2, 6 and 9 (ARCHITECTURE.md); each imports only from its own layer and below."""
