"""Runs from the controller's side: any kind's run read, checked, pulled home, followed and ended
(``runs``); a checkpoint from a rented machine checked before it is kept (``checkpoint_vet``); a
dataset staged on a volume (``staged_data``); and LibreYOLO's own parts (``training``, and under
torchrun on a group, ``group_training``).

Layers 7 to 11 (ARCHITECTURE.md); each imports only from its own layer and below: the job kinds
above use this package, never the reverse."""
