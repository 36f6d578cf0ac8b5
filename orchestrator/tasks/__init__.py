"""What a user asks for, as words: a task file (``task``; the peers' SkyPilot and dstack files
translated, ``peer_tasks``), a workdir packed for the upload (``workdir``), a YOLO dataset checked and
packed (``dataset``), and the Hugging Face Hub (``hub``).

Layer 2 (ARCHITECTURE.md): these modules import only the other words (``orchestrator.errors``,
``text``, ``config``, ``nodes``...) and each other; nothing here reaches a provider, the ledger or SSH."""
