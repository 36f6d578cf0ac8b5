"""SSH: a connection with the host key pinned (``remote``), waiting for an instance to answer and
finding the route that does (``reach``), the ssh-config listener (``sshconfig``), and ``orch ssh``'s
own command line (``ssh_exec``).

Layers 3 and 7 (ARCHITECTURE.md): ``remote`` imports only words; the others read the ledger."""
